"""Kimi-K2-Instruct, its early chat template.

Reproduces Moonshot's first Kimi-K2-Instruct chat_template.jinja, as copied to llama.cpp
(ggml-org/llama.cpp `models/templates/moonshotai-Kimi-K2.jinja` @ 02f4a631678b), together with
the tokenizer's deep sort of the tool dicts (tokenization_kimi.py):
- tools first: `<|im_system|>tool_declare<|im_middle|>{tools as JSON}<|im_end|>`, JSON with
  ", " / ": " separators, non-ASCII kept, keys sorted at every level;
- "You are a helpful assistant" as a system turn when the first message is not a system message;
- role headers with the fixed names system / user / assistant / tool (a message's `name` is not
  used); each message is its content then `<|im_end|>`; a tool result is its bare content;
- generation prompt `<|im_assistant|>assistant<|im_middle|>`; no thinking mode.

That template has no slot for an assistant's tool calls or reasoning (it would silently drop them),
so we refuse them in history. The model still answers with Kimi's tool-call section, which
render_completion writes: content, `<|tool_calls_section_begin|>` + per call
`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{arguments}<|tool_call_end|>`
+ `<|tool_calls_section_end|>`, then `<|im_end|>`.

Later K2-Instruct revisions render tool calls in history; no public copy of them could be tied to
Moonshot's file, so they are not reproduced here.
"""

from __future__ import annotations

from draftgate.templates.base import (
    Builder, Completion, Segment, TemplateError, check_messages, check_tools, content_of, reasoning_of,
)
from draftgate.templates.kimi import (
    ARG_BEGIN, CALL_BEGIN, CALL_END, IM_ASSISTANT, IM_END, IM_MIDDLE, IM_SYSTEM, IM_USER, SECTION_BEGIN,
    SECTION_END, KimiTemplate, json_tool_declaration, kimi_tool_call_id,
)

K2_DEFAULT_SYSTEM = "You are a helpful assistant"
ROLE_HEADERS = {"system": (IM_SYSTEM, "system"), "user": (IM_USER, "user"),
                "assistant": (IM_ASSISTANT, "assistant"), "tool": (IM_SYSTEM, "tool")}


class KimiK2Template(KimiTemplate):
    name = "kimi_k2"
    official = ("Kimi-K2-Instruct's early chat_template.jinja (llama.cpp models/templates/"
                "moonshotai-Kimi-K2.jinja @ 02f4a631678b) + tokenization_kimi.py's deep sort of tools")
    special_names = frozenset({IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END,
                               SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END})
    think_tokens = None

    def jinja_kwargs(self, thinking: bool) -> dict:
        return {}

    def render_prompt(self, messages: list[dict], tools: list[dict] | None, thinking: bool) -> list[Segment]:
        check_messages(self.name, messages)
        tools = check_tools(self.name, tools)
        self._no_thinking(thinking)
        b = Builder()
        if tools:
            self.declare(b, json_tool_declaration(tools))
        for i, m in enumerate(messages):
            if m.get("tool_calls"):
                raise TemplateError(f"kimi_k2: messages[{i}] has tool_calls, which K2-Instruct's early template "
                                    "drops; filter such prompts upstream or use kimi_k2_thinking / kimi_k25")
            if reasoning_of(self.name, m, i):
                raise TemplateError(f"kimi_k2: messages[{i}] carries reasoning, which K2-Instruct's template "
                                    "has no slot for; drop it upstream")
            if i == 0 and m["role"] != "system":
                b.special(IM_SYSTEM).text("system").special(IM_MIDDLE).text(K2_DEFAULT_SYSTEM).special(IM_END)
            token, role = ROLE_HEADERS[m["role"]]
            b.special(token).text(role).special(IM_MIDDLE)
            b.text(content_of(self.name, m, i, allow_none=False)).special(IM_END)
        return b.special(IM_ASSISTANT).text("assistant").special(IM_MIDDLE).segments()

    def render_completion(self, c: Completion, thinking: bool) -> list[Segment]:
        self._no_thinking(thinking)
        self.no_reasoning(c, "K2-Instruct does not think")
        return self.answer(Builder(), c)

    def _no_thinking(self, thinking: bool) -> None:
        if thinking:
            raise TemplateError("kimi_k2: thinking=True, but K2-Instruct has no thinking mode; set "
                                "template.thinking: false (or use kimi_k2_thinking / kimi_k25)")


__all__ = ["KimiK2Template", "kimi_tool_call_id"]
