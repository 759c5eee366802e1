"""Typed pieces of a rendered chat: text segments and special tokens, completions, templates.

A template renders to a list of segments instead of one string, so that special tokens are
inserted structurally (by the contract's ids) and text is encoded with special-token parsing
off: a literal "<|im_end|>" written inside content stays text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence


class TemplateError(ValueError):
    """A message, tool or completion that the template cannot render as the model would see it."""


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Special:
    name: str


Segment = Text | Special


@dataclass(frozen=True)
class ToolCall:
    name: str
    # Verbatim as received from the API: never parsed and re-serialised (spacing, key order and
    # escapes are part of the tokens the model produced).
    arguments: str
    id: str | None = None


@dataclass(frozen=True)
class Completion:
    reasoning: str | None
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    # finish_reason=length: the model never produced its end token (nor, when it stopped inside
    # its reasoning, the think-end token).
    truncated: bool = False
    # Kimi-K2 sometimes goes straight from reasoning into a tool-call section without "</think>".
    think_closed: bool = True


class ChatTemplate:
    name: str
    # Which serving family the format belongs to ("chatml" | "qwen3" | "kimi"): code that depends
    # on the format, not on one release's template, keys on this.
    family: str
    # One line: which official template (model, file, revision) this class reproduces byte for byte.
    official: str
    # Every special-token name the template can emit; the tokenizer contract resolves and
    # verifies exactly these.
    special_names: frozenset[str]
    end_token: str
    think_tokens: tuple[str, str] | None = None
    tool_marker_pairs: tuple[tuple[str, str], ...] = ()

    def render_prompt(self, messages: list[dict], tools: list[dict] | None, thinking: bool) -> list[Segment]:
        """The conversation so far, ending with the generation prefix."""
        raise NotImplementedError

    def render_completion(self, c: Completion, thinking: bool) -> list[Segment]:
        """What the model generated after the prompt, ending with the end token unless truncated."""
        raise NotImplementedError

    def jinja_kwargs(self, thinking: bool) -> dict:
        """Extra keyword arguments the official template (apply_chat_template) needs to render
        what render_prompt(..., thinking) renders."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<ChatTemplate {self.name}>"


def render_text(segments: Iterable[Segment]) -> str:
    return "".join(s.text if isinstance(s, Text) else s.name for s in segments)


def merge_text(segments: Iterable[Segment]) -> list[Segment]:
    # The model sees one string between two specials: adjacent text must be encoded as one piece
    # (text-text boundaries merge in BPE), and empty text encodes to nothing.
    out: list[Segment] = []
    for s in segments:
        if isinstance(s, Text):
            if not s.text:
                continue
            if out and isinstance(out[-1], Text):
                out[-1] = Text(out[-1].text + s.text)
                continue
        out.append(s)
    return out


class Builder:
    """Collects segments, merging text as it goes, so renders come out canonical."""

    def __init__(self) -> None:
        self._out: list[Segment] = []

    def text(self, s: str) -> Builder:
        if s:
            if self._out and isinstance(self._out[-1], Text):
                self._out[-1] = Text(self._out[-1].text + s)
            else:
                self._out.append(Text(s))
        return self

    def special(self, *names: str) -> Builder:
        self._out.extend(Special(n) for n in names)
        return self

    def segments(self) -> list[Segment]:
        return self._out


# ---------------------------------------------------------------- reading OpenAI-shaped messages

ROLES = ("system", "user", "assistant", "tool")


def check_messages(template: str, messages: Sequence[Any]) -> None:
    if not isinstance(messages, (list, tuple)):
        raise TemplateError(f"{template}: messages must be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise TemplateError(f"{template}: messages is empty; a prompt needs at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TemplateError(f"{template}: messages[{i}] must be a dict, got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise TemplateError(
                f"{template}: messages[{i}].role is {m.get('role')!r}; use one of {', '.join(ROLES)}")


def content_of(template: str, m: dict, i: int, *, allow_none: bool) -> str | None:
    c = m.get("content")
    if c is None:
        if allow_none:
            return None
        raise TemplateError(f"{template}: messages[{i}] ({m['role']}) has no content; give it a string")
    if not isinstance(c, str):
        raise TemplateError(
            f"{template}: messages[{i}].content is a {type(c).__name__}; content parts are not "
            "supported: join the text parts into one string upstream")
    return c


def reasoning_of(template: str, m: dict, i: int) -> str | None:
    # OpenRouter returns "reasoning"; HF templates read "reasoning_content". Same thing.
    r, rc = m.get("reasoning"), m.get("reasoning_content")
    if r is not None and rc is not None and r != rc:
        raise TemplateError(
            f"{template}: messages[{i}] has both reasoning and reasoning_content and they differ; keep one")
    out = rc if rc is not None else r
    if out is not None and not isinstance(out, str):
        raise TemplateError(f"{template}: messages[{i}].reasoning must be a string, got {type(out).__name__}")
    return out


def hf_tojson(x: Any) -> str:
    # transformers' chat-template `tojson` filter: json.dumps with ensure_ascii=False and the
    # default ", " / ": " separators (transformers/utils/chat_template_utils.py).
    return json.dumps(x, ensure_ascii=False)


def tool_calls_of(template: str, m: dict, i: int) -> tuple[ToolCall, ...]:
    """Tool calls of a history message; dict arguments render as the official templates do (tojson)."""
    raw = m.get("tool_calls") or []
    if not isinstance(raw, list):
        raise TemplateError(f"{template}: messages[{i}].tool_calls must be a list")
    out = []
    for j, tc in enumerate(raw):
        where = f"{template}: messages[{i}].tool_calls[{j}]"
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TemplateError(f"{where} must be {{id, type, function: {{name, arguments}}}}")
        args = fn.get("arguments")
        if isinstance(args, (dict, list)):
            args = hf_tojson(args)
        elif not isinstance(args, str):
            raise TemplateError(f"{where}.function.arguments must be a string (as received) or an object")
        tid = tc.get("id")
        out.append(ToolCall(name=fn["name"], arguments=args, id=tid if isinstance(tid, str) else None))
    return tuple(out)


def check_tools(template: str, tools: Any) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise TemplateError(f"{template}: tools must be a list of OpenAI tool dicts")
    return tools
