"""Kimi-K2-Thinking.

Reproduces Moonshot's Kimi-K2-Thinking chat_template.jinja, as copied to llama.cpp
(ggml-org/llama.cpp `models/templates/moonshotai-Kimi-K2-Thinking.jinja` @ 0c3c896ea806; not
llama.cpp's own edited `Kimi-K2-Thinking.jinja`), with the tokenizer's deep sort of the tool dicts:
- tools first: `<|im_system|>tool_declare<|im_middle|>{tools as JSON}<|im_end|>` (", " / ": ",
  non-ASCII kept, keys sorted at every level);
- "You are Kimi, an AI assistant created by Moonshot AI." as a system turn when the first message
  is not a system message;
- role headers `<|im_user|>` / `<|im_assistant|>` / `<|im_system|>` (every other role) + the
  message's `name` or its role + `<|im_middle|>`;
- every assistant turn opens a think block: empty up to the last assistant reply without tool
  calls, `<think>{reasoning_content}</think>` after it (the current tool loop); then the content and
  the tool-call section with the ids given, verbatim;
- tool results `## Return of {tool_call_id}\\n{content}` under `<|im_system|>{name or "tool"}`;
- generation prompt `<|im_assistant|>assistant<|im_middle|>` and nothing more: the model writes
  `<think>` itself, so it is the first token of every completion here.

The template has no thinking switch (K2-Thinking always thinks): thinking=False is refused.
"""

from __future__ import annotations

from draftgate.templates.base import Builder, Completion, Segment, TemplateError, check_messages, check_tools
from draftgate.templates.kimi import (
    ARG_BEGIN, CALL_BEGIN, CALL_END, END_THINK, IM_ASSISTANT, IM_END, IM_MIDDLE, IM_SYSTEM, IM_USER,
    SECTION_BEGIN, SECTION_END, THINK, KimiTemplate, json_tool_declaration,
)

KIMI_DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."


class KimiK2ThinkingTemplate(KimiTemplate):
    name = "kimi_k2_thinking"
    official = ("Kimi-K2-Thinking's chat_template.jinja (llama.cpp models/templates/"
                "moonshotai-Kimi-K2-Thinking.jinja @ 0c3c896ea806) + tokenization_kimi.py's deep sort of tools")
    special_names = frozenset({IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END, THINK, END_THINK,
                               SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END})
    think_tokens = (THINK, END_THINK)

    def jinja_kwargs(self, thinking: bool) -> dict:
        return {}

    def render_prompt(self, messages: list[dict], tools: list[dict] | None, thinking: bool) -> list[Segment]:
        check_messages(self.name, messages)
        tools = check_tools(self.name, tools)
        self._thinking_only(thinking)
        b = Builder()
        if tools:
            self.declare(b, json_tool_declaration(tools))
        if messages[0]["role"] != "system":
            b.special(IM_SYSTEM).text("system").special(IM_MIDDLE).text(KIMI_DEFAULT_SYSTEM).special(IM_END)
        self.messages_with_think(b, messages, keep_reasoning=True)
        return b.special(IM_ASSISTANT).text("assistant").special(IM_MIDDLE).segments()

    def render_completion(self, c: Completion, thinking: bool) -> list[Segment]:
        # The prompt ends at <|im_middle|>: the completion opens its own think block.
        self._thinking_only(thinking)
        return self.after_reasoning(Builder().special(THINK).text(c.reasoning or ""), c)

    def _thinking_only(self, thinking: bool) -> None:
        if not thinking:
            raise TemplateError("kimi_k2_thinking: thinking=False, but K2-Thinking's template has no "
                                "non-thinking mode; set template.thinking: true (or use kimi_k25)")
