"""What the Kimi templates share: special tokens, role headers, tool-call sections, tool results.

The three releases (kimi_k2, kimi_k2_thinking, kimi_k25) differ in the default system turn, the
tool declaration, reasoning in history and the generation prompt; each module says which official
file it reproduces. Common to all: no whitespace between parts, every message closed by
`<|im_end|>`, and the tokenizer's apply_chat_template deep-sorting the tool dicts' keys before
the template sees them (tokenization_kimi.py).
"""

from __future__ import annotations

import json
import re

from draftgate.templates.base import (
    Builder, ChatTemplate, Completion, Segment, TemplateError, ToolCall, content_of, reasoning_of,
    tool_calls_of,
)
from draftgate.templates.kimi_tools_ts import deep_sorted

IM_SYSTEM, IM_USER, IM_ASSISTANT = "<|im_system|>", "<|im_user|>", "<|im_assistant|>"
IM_MIDDLE, IM_END = "<|im_middle|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

HEADERS = {"user": IM_USER, "assistant": IM_ASSISTANT}      # every other role: <|im_system|>
TOOL_NAMES = frozenset({SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END})

_ID = re.compile(r"(?:functions\.)?(.+):(\d+)")


def kimi_tool_call_id(raw_id: str | None, name: str, idx: int) -> str:
    """The id text the model itself wrote for a tool call: `functions.NAME:IDX`.

    Providers hand it back as-is, stripped of `functions.` (`add:0`, seen on OpenRouter), or
    replaced by their own (`call_...`, 32-hex); idx is the call's index in the conversation's
    running count of tool calls, used only when the provider's id carries none.
    """
    m = _ID.fullmatch(raw_id or "")
    if m and m.group(1) == name:
        return f"functions.{name}:{m.group(2)}"
    return f"functions.{name}:{idx}"


def json_tool_declaration(tools: list[dict]) -> str:
    # K2 and K2-Thinking: `tools | tojson` (transformers: ", " / ": ", no ASCII escaping) of the
    # deep-sorted tools; sorting every level is what json's sort_keys does.
    return json.dumps(deep_sorted(tools), ensure_ascii=False)


def last_plain_assistant(messages: list[dict]) -> int:
    """Index of the last assistant turn without tool calls, -1 when none: history ends there."""
    return max((i for i, m in enumerate(messages) if m["role"] == "assistant" and not m.get("tool_calls")),
               default=-1)


class KimiTemplate(ChatTemplate):
    family = "kimi"
    end_token = IM_END
    tool_marker_pairs = ((SECTION_BEGIN, SECTION_END), (CALL_BEGIN, CALL_END))

    # ---- pieces of a prompt

    def declare(self, b: Builder, text: str) -> None:
        b.special(IM_SYSTEM).text("tool_declare").special(IM_MIDDLE).text(text).special(IM_END)

    def header(self, b: Builder, m: dict) -> None:
        # K2-Thinking and K2.5 write the message's `name` (else its role) after the role token.
        b.special(HEADERS.get(m["role"], IM_SYSTEM)).text(m.get("name") or m["role"]).special(IM_MIDDLE)

    def history_calls(self, b: Builder, m: dict, i: int) -> None:
        calls = tool_calls_of(self.name, m, i)
        for j, tc in enumerate(calls):
            if tc.id is None:
                raise TemplateError(
                    f"{self.name}: messages[{i}].tool_calls[{j}] has no id; Kimi's template renders "
                    "ids verbatim: give it the model's id (functions.NAME:IDX)")
        self.tool_section(b, calls, [tc.id for tc in calls])

    def tool_result(self, b: Builder, m: dict, i: int) -> None:
        tcid = m.get("tool_call_id")
        if not isinstance(tcid, str):
            raise TemplateError(f"{self.name}: messages[{i}] (tool) needs tool_call_id: it is rendered "
                                "as '## Return of {tool_call_id}'")
        b.text(f"## Return of {tcid}\n" + content_of(self.name, m, i, allow_none=False))

    def shown_reasoning(self, m: dict, i: int) -> str:
        # The template reads message.get('reasoning_content', ''): a key holding None would print
        # the text "None" into the prompt, which no model was trained on.
        if "reasoning_content" in m and m["reasoning_content"] is None:
            raise TemplateError(f"{self.name}: messages[{i}].reasoning_content is None, which the official "
                                "template renders as the text 'None'; drop the key or give a string")
        return reasoning_of(self.name, m, i) or ""

    def messages_with_think(self, b: Builder, messages: list[dict], keep_reasoning: bool) -> None:
        """K2-Thinking and K2.5: every assistant turn opens a think block; it holds the reasoning
        only after the last plain assistant reply (the current tool loop) and when keep_reasoning."""
        last_plain = last_plain_assistant(messages)
        for i, m in enumerate(messages):
            self.header(b, m)
            role = m["role"]
            if role == "assistant":
                reasoning = self.shown_reasoning(m, i) if i > last_plain and keep_reasoning else ""
                b.special(THINK).text(reasoning).special(END_THINK)
                b.text(content_of(self.name, m, i, allow_none=True) or "")
                if m.get("tool_calls"):
                    self.history_calls(b, m, i)
            elif role == "tool":
                self.tool_result(b, m, i)
            else:
                # The Jinja renders a missing content as nothing; a content-less user or system
                # turn is bad data, so it is an error here.
                b.text(content_of(self.name, m, i, allow_none=False))
            b.special(IM_END)

    @staticmethod
    def tool_section(b: Builder, calls: tuple[ToolCall, ...], ids: list[str]) -> None:
        if not calls:
            return
        b.special(SECTION_BEGIN)
        for tc, tid in zip(calls, ids):
            b.special(CALL_BEGIN).text(tid).special(ARG_BEGIN).text(tc.arguments).special(CALL_END)
        b.special(SECTION_END)

    # ---- pieces of a completion

    def answer(self, b: Builder, c: Completion) -> list[Segment]:
        """Content, then the tool-call section with the model's own ids, then the end token."""
        b.text(c.content or "")
        self.tool_section(b, c.tool_calls, [kimi_tool_call_id(tc.id, tc.name, k) for k, tc in enumerate(c.tool_calls)])
        if not c.truncated:
            b.special(IM_END)
        return b.segments()

    def after_reasoning(self, b: Builder, c: Completion) -> list[Segment]:
        """Reasoning already written into b: close the think block (unless the model did not) and answer."""
        content = c.content or ""
        if c.truncated and not content and not c.tool_calls:
            return b.segments()          # stopped inside the think block
        if c.think_closed:
            b.special(END_THINK)
        elif content:
            raise TemplateError(f"{self.name}: think_closed=False with content: without </think> the "
                                "content would read as reasoning; only tool calls may follow")
        return self.answer(b, c)

    def no_reasoning(self, c: Completion, why: str) -> None:
        if c.reasoning:
            raise TemplateError(f"{self.name}: completion has reasoning but {why}; set template.thinking "
                                "to match the request or use the template of the model that answered")
