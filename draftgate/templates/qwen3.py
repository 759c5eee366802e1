"""Qwen3 (the hybrid-thinking Qwen3 models' official template).

Source: the `chat_template` of Qwen3-0.6B's tokenizer_config.json as llama.cpp copied it
(ggml-org/llama.cpp `models/templates/Qwen-Qwen3-0.6B.jinja`, added in e121edc4324a, PR #13771).
A later revision of the official file (Qwen/Qwen3-8B @ 895c8d171bc0) only adds `is string` guards
for non-string content and reasoning; for string content, the only kind accepted here, it renders
the same bytes, so one class stands for both. What we reproduce:
- tools go into the system turn: the fixed wording below (byte-exact: the model was trained on
  it) then one `tojson` line per tool inside <tools></tools>;
- tool results become one user turn of <tool_response> blocks per run of tool messages;
- reasoning of an assistant turn is kept only after the last real user query (the current
  multi-step tool loop) and dropped before it; `<think>\\n{r.strip("\\n")}\\n</think>\\n\\n`;
- a tool call is `<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>`, ARGS verbatim,
  preceded by a newline unless it is the first call of a turn with empty content;
- enable_thinking=false appends an empty `<think>\\n\\n</think>\\n\\n` to the generation prompt.

`<think>`, `<tool_call>`, `<tool_response>` (and their closers) are added tokens in Qwen3's
vocabulary: a serving engine tokenizing the rendered string turns each into its single id, also
inside the fixed tools wording, so they are Special segments here.
"""

from __future__ import annotations

from draftgate.templates.base import (
    Builder, ChatTemplate, Completion, Segment, TemplateError, ToolCall, check_messages,
    check_tools, content_of, hf_tojson, reasoning_of, tool_calls_of,
)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
TOOL_CALL, END_TOOL_CALL = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, END_TOOL_RESPONSE = "<tool_response>", "</tool_response>"

# The official wording, split where the added tokens sit.
TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_TAIL = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
TOOLS_EXAMPLE = '\n{"name": <function-name>, "arguments": <args-json-object>}\n'


class Qwen3Template(ChatTemplate):
    name = "qwen3"
    family = "qwen3"
    official = ("Qwen3-0.6B/8B tokenizer_config.json chat_template (llama.cpp models/templates/"
                "Qwen-Qwen3-0.6B.jinja @ e121edc4324a; renders as Qwen3-8B @ 895c8d171bc0 for string content)")
    special_names = frozenset({IM_START, IM_END, THINK, END_THINK, TOOL_CALL, END_TOOL_CALL,
                               TOOL_RESPONSE, END_TOOL_RESPONSE})
    end_token = IM_END
    think_tokens = (THINK, END_THINK)
    tool_marker_pairs = ((TOOL_CALL, END_TOOL_CALL), (TOOL_RESPONSE, END_TOOL_RESPONSE))

    def jinja_kwargs(self, thinking: bool) -> dict:
        return {"enable_thinking": thinking}

    def render_prompt(self, messages: list[dict], tools: list[dict] | None, thinking: bool) -> list[Segment]:
        check_messages(self.name, messages)
        tools = check_tools(self.name, tools)
        b = Builder()
        first_is_system = bool(messages) and messages[0]["role"] == "system"
        if tools:
            b.special(IM_START).text("system\n")
            if first_is_system:
                b.text(content_of(self.name, messages[0], 0, allow_none=False) + "\n\n")
            b.text(TOOLS_HEAD)
            for t in tools:
                b.text("\n" + hf_tojson(t))
            b.text(TOOLS_TAIL).special(TOOL_CALL, END_TOOL_CALL).text(" XML tags:\n")
            b.special(TOOL_CALL).text(TOOLS_EXAMPLE).special(END_TOOL_CALL, IM_END).text("\n")
        elif first_is_system:
            b.special(IM_START).text("system\n" + content_of(self.name, messages[0], 0, allow_none=False))
            b.special(IM_END).text("\n")

        last_query = _last_query_index(messages)
        n = len(messages)
        for i, m in enumerate(messages):
            role = m["role"]
            if role == "user" or (role == "system" and i > 0):
                b.special(IM_START).text(f"{role}\n{content_of(self.name, m, i, allow_none=False)}")
                b.special(IM_END).text("\n")
            elif role == "assistant":
                content = content_of(self.name, m, i, allow_none=True) or ""
                reasoning = reasoning_of(self.name, m, i)
                if reasoning is None and END_THINK in content:
                    # The template's fallback: reasoning written inline in the content.
                    head, _, tail = content.partition(END_THINK)
                    reasoning = head.rstrip("\n").split(THINK)[-1].lstrip("\n")
                    content = content.split(END_THINK)[-1].lstrip("\n")
                b.special(IM_START).text("assistant\n")
                if i > last_query and (i == n - 1 or reasoning):
                    self._think(b, reasoning or "")
                    b.text(content.lstrip("\n"))
                else:
                    b.text(content)
                self._tool_calls(b, tool_calls_of(self.name, m, i), bool(content))
                b.special(IM_END).text("\n")
            elif role == "tool":
                if i == 0 or messages[i - 1]["role"] != "tool":
                    b.special(IM_START).text("user")
                b.text("\n").special(TOOL_RESPONSE)
                b.text("\n" + content_of(self.name, m, i, allow_none=False) + "\n").special(END_TOOL_RESPONSE)
                if i == n - 1 or messages[i + 1]["role"] != "tool":
                    b.special(IM_END).text("\n")
        b.special(IM_START).text("assistant\n")
        if not thinking:
            b.special(THINK).text("\n\n").special(END_THINK).text("\n\n")
        return b.segments()

    def render_completion(self, c: Completion, thinking: bool) -> list[Segment]:
        b = Builder()
        content = c.content or ""
        if thinking:
            if c.truncated and not content and not c.tool_calls:
                # Stopped inside the think block: no closer was generated.
                return b.special(THINK).text("\n" + (c.reasoning or "").lstrip("\n")).segments()
            self._think(b, c.reasoning or "")
            b.text(content.lstrip("\n"))
        else:
            if c.reasoning:
                raise TemplateError("qwen3: completion has reasoning but thinking is disabled (the "
                                    "prompt already closed an empty think block); set "
                                    "template.thinking to match the request")
            b.text(content)
        self._tool_calls(b, c.tool_calls, bool(content))
        if not c.truncated:
            b.special(IM_END)
        return b.segments()

    @staticmethod
    def _think(b: Builder, reasoning: str) -> None:
        b.special(THINK).text("\n" + reasoning.strip("\n") + "\n").special(END_THINK).text("\n\n")

    @staticmethod
    def _tool_calls(b: Builder, calls: tuple[ToolCall, ...], has_content: bool) -> None:
        for k, tc in enumerate(calls):
            if k > 0 or has_content:
                b.text("\n")
            b.special(TOOL_CALL).text('\n{"name": "' + tc.name + '", "arguments": ' + tc.arguments + "}\n")
            b.special(END_TOOL_CALL)


def _last_query_index(messages: list[dict]) -> int:
    # The last user message that is a real query, not tool output passed back as a user turn.
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m["role"] == "user":
            c = m.get("content")
            if not (isinstance(c, str) and c.startswith(TOOL_RESPONSE) and c.endswith(END_TOOL_RESPONSE)):
                return i
    return len(messages) - 1
