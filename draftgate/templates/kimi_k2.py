"""Kimi-K2 / K2.5.

Source for the conversation layout: Moonshot's Kimi-K2-Thinking chat template, as copied to
llama.cpp's `models/templates/moonshotai-Kimi-K2-Thinking.jinja`:
- tools first: `<|im_system|>tool_declare<|im_middle|>{tools | tojson}<|im_end|>`, where
  tokenization_kimi.py deep-sorts the tool dicts' keys before rendering;
- a default system turn when the first message is not a system message;
- role headers `<|im_user|>` / `<|im_assistant|>` / `<|im_system|>` + (message name or role) +
  `<|im_middle|>`, each message closed by `<|im_end|>`, no whitespace anywhere;
- assistant turns up to the last assistant turn without tool calls get an empty
  `<think></think>`; later ones (the current tool loop) keep `<think>{reasoning}</think>`;
- tool calls `<|tool_calls_section_begin|>` + per call `<|tool_call_begin|>{id}
  <|tool_call_argument_begin|>{arguments}<|tool_call_end|>` + `<|tool_calls_section_end|>`,
  ids verbatim (the model's own form is `functions.NAME:IDX`);
- tool results `<|im_system|>{name or "tool"}<|im_middle|>## Return of {tool_call_id}\\n{content}`.
K2.5's generation prompt (FACTS.md; HF K2.5 tokenizers render `...<|im_middle|><think></think>`
with thinking=False): `<|im_assistant|>assistant<|im_middle|>` then `<think>` when thinking, else
`<think></think>`.

Not reproduced by default: K2.5's tokenizer renders tool declarations as a TypeScript-style
namespace (tool_declaration_ts.py beside its tokenization_kimi.py), not JSON. Pass that encoder
as `declare_tools` (e.g. from a user-provided K2.5 tokenizer directory) to render K2.5 prompts
with tools exactly; the JSON default is K2 / K2-Thinking's form.
"""

from __future__ import annotations

import json
import re
from typing import Callable

from draftgate.templates.base import (
    Builder, ChatTemplate, Completion, Segment, TemplateError, ToolCall, check_messages,
    check_tools, content_of, reasoning_of, tool_calls_of,
)

IM_SYSTEM, IM_USER, IM_ASSISTANT = "<|im_system|>", "<|im_user|>", "<|im_assistant|>"
IM_MIDDLE, IM_END = "<|im_middle|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

KIMI_DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."

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
    # tokenization_kimi.py deep-sorts dict keys, then the template applies transformers' tojson.
    return json.dumps(tools, ensure_ascii=False, sort_keys=True)


class KimiK2Template(ChatTemplate):
    name = "kimi_k2"
    special_names = frozenset({IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END, THINK, END_THINK,
                               SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END})
    end_token = IM_END
    think_tokens = (THINK, END_THINK)
    tool_marker_pairs = ((SECTION_BEGIN, SECTION_END), (CALL_BEGIN, CALL_END))

    def __init__(self, declare_tools: Callable[[list[dict]], str] = json_tool_declaration) -> None:
        self.declare_tools = declare_tools

    def render_prompt(self, messages: list[dict], tools: list[dict] | None, thinking: bool) -> list[Segment]:
        check_messages(self.name, messages)
        tools = check_tools(self.name, tools)
        b = Builder()
        if tools:
            b.special(IM_SYSTEM).text("tool_declare").special(IM_MIDDLE)
            b.text(self.declare_tools(tools)).special(IM_END)
        if not messages or messages[0]["role"] != "system":
            b.special(IM_SYSTEM).text("system").special(IM_MIDDLE).text(KIMI_DEFAULT_SYSTEM).special(IM_END)

        last_plain = max((i for i, m in enumerate(messages)
                          if m["role"] == "assistant" and not m.get("tool_calls")), default=-1)
        for i, m in enumerate(messages):
            role = m["role"]
            header = {"user": IM_USER, "assistant": IM_ASSISTANT}.get(role, IM_SYSTEM)
            b.special(header).text(m.get("name") or role).special(IM_MIDDLE)
            if role == "assistant":
                reasoning = "" if i <= last_plain else (reasoning_of(self.name, m, i) or "")
                b.special(THINK).text(reasoning).special(END_THINK)
                b.text(content_of(self.name, m, i, allow_none=True) or "")
                calls = tool_calls_of(self.name, m, i)
                for j, tc in enumerate(calls):
                    if tc.id is None:
                        raise TemplateError(
                            f"kimi_k2: messages[{i}].tool_calls[{j}] has no id; Kimi's template "
                            "renders ids verbatim: give it the model's id (functions.NAME:IDX)")
                self._tool_section(b, calls, [tc.id for tc in calls])
            elif role == "tool":
                tcid = m.get("tool_call_id")
                if not isinstance(tcid, str):
                    raise TemplateError(f"kimi_k2: messages[{i}] (tool) needs tool_call_id: it is "
                                        "rendered as '## Return of {tool_call_id}'")
                b.text(f"## Return of {tcid}\n" + content_of(self.name, m, i, allow_none=False))
            else:
                # The Jinja renders a missing content as nothing; a content-less user or system
                # turn is bad data, so it is an error here.
                b.text(content_of(self.name, m, i, allow_none=False))
            b.special(IM_END)
        b.special(IM_ASSISTANT).text("assistant").special(IM_MIDDLE)
        # Thinking: <think> is prefilled and belongs to the prompt; otherwise an empty block is.
        return (b.special(THINK) if thinking else b.special(THINK, END_THINK)).segments()

    def render_completion(self, c: Completion, thinking: bool) -> list[Segment]:
        b = Builder()
        content = c.content or ""
        if thinking:
            b.text(c.reasoning or "")
            if c.truncated and not content and not c.tool_calls:
                return b.segments()          # stopped inside the think block
            if c.think_closed:
                b.special(END_THINK)
            elif content:
                raise TemplateError("kimi_k2: think_closed=False with content: without </think> the "
                                    "content would read as reasoning; only tool calls may follow")
        elif c.reasoning:
            raise TemplateError("kimi_k2: completion has reasoning but thinking is disabled (the "
                                "prompt closed an empty think block); set template.thinking to "
                                "match the request")
        b.text(content)
        ids = [kimi_tool_call_id(tc.id, tc.name, k) for k, tc in enumerate(c.tool_calls)]
        self._tool_section(b, c.tool_calls, ids)
        if not c.truncated:
            b.special(IM_END)
        return b.segments()

    @staticmethod
    def _tool_section(b: Builder, calls: tuple[ToolCall, ...], ids: list[str]) -> None:
        if not calls:
            return
        b.special(SECTION_BEGIN)
        for tc, tid in zip(calls, ids):
            b.special(CALL_BEGIN).text(tid).special(ARG_BEGIN).text(tc.arguments).special(CALL_END)
        b.special(SECTION_END)
