"""Kimi-K2.5, thinking on and off.

Reproduces Moonshot's Kimi-K2.5 chat_template.jinja (public copy: lightseekorg/smg
`crates/tokenizer/tests/fixtures/kimi_k25/chat_template.jinja` @ 310b85154764) rendered through
K2.5's own tokenizer hook (tokenization_kimi.py: tools deep-sorted, then declared by
tool_declaration_ts.py as `tools_ts_str`; `thinking` defaults to true):
- tools first: `<|im_system|>tool_declare<|im_middle|>{declaration}<|im_end|>`; the declaration
  is the TypeScript-style text (kimi_tools_ts.py), or compact JSON (`,` / `:`, keys sorted) when
  that encoder gives up. Real providers declare K2.5 tools the TypeScript way: bills for the same
  request come out far below the JSON form's count (docs/openrouter.md). `declare_tools=compact_json_declaration`
  renders what the bare Jinja renders when no hook supplies `tools_ts_str`;
- NO default system turn;
- role headers as in K2-Thinking (`name` or role after the role token);
- assistant turns open a think block: empty up to the last assistant reply without tool calls; after
  it `<think>{reasoning_content}</think>` with thinking on, still empty with thinking off;
- tool results `## Return of {tool_call_id}\\n{content}`;
- generation prompt `<|im_assistant|>assistant<|im_middle|>` + `<think>` (thinking: the open
  think block belongs to the prompt, the completion starts inside it) or + `<think></think>`.
Media placeholders (images, video) exist in the template; content parts are refused here.
"""

from __future__ import annotations

from typing import Callable

from draftgate.templates.base import Builder, Completion, Segment, check_messages, check_tools
from draftgate.templates.kimi import (
    ARG_BEGIN, CALL_BEGIN, CALL_END, END_THINK, IM_ASSISTANT, IM_END, IM_MIDDLE, IM_SYSTEM, IM_USER,
    SECTION_BEGIN, SECTION_END, THINK, KimiTemplate,
)
from draftgate.templates.kimi_tools_ts import compact_json_declaration, ts_declaration


class KimiK25Template(KimiTemplate):
    name = "kimi_k25"
    official = ("Kimi-K2.5's chat_template.jinja (smg tests/fixtures/kimi_k25 @ 310b85154764) through "
                "tokenization_kimi.py's hook (deep sort + tool_declaration_ts.py as tools_ts_str)")
    special_names = frozenset({IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END, THINK, END_THINK,
                               SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END})
    think_tokens = (THINK, END_THINK)

    def __init__(self, declare_tools: Callable[[list[dict]], str] = ts_declaration) -> None:
        self.declare_tools = declare_tools

    def jinja_kwargs(self, thinking: bool) -> dict:
        return {"thinking": thinking}

    def render_prompt(self, messages: list[dict], tools: list[dict] | None, thinking: bool) -> list[Segment]:
        check_messages(self.name, messages)
        tools = check_tools(self.name, tools)
        b = Builder()
        if tools:
            self.declare(b, self.declare_tools(tools))
        self.messages_with_think(b, messages, keep_reasoning=thinking)
        b.special(IM_ASSISTANT).text("assistant").special(IM_MIDDLE)
        return (b.special(THINK) if thinking else b.special(THINK, END_THINK)).segments()

    def render_completion(self, c: Completion, thinking: bool) -> list[Segment]:
        if thinking:
            # <think> is prefilled by the prompt: the completion is reasoning, </think>, answer.
            return self.after_reasoning(Builder().text(c.reasoning or ""), c)
        self.no_reasoning(c, "thinking is disabled (the prompt closed an empty think block)")
        return self.answer(Builder(), c)


__all__ = ["KimiK25Template", "compact_json_declaration", "ts_declaration"]
