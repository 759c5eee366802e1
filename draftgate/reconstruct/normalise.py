"""Provider normalisation: one response row -> the completion the model produced, as parts.

Providers hand back the model's output cut into `reasoning`, `content` and `tool_calls`, each
with their own quirks (docs/openrouter.md). This module undoes the quirks it can undo exactly,
names every one it applied, and quarantines (with a reason code) what cannot be exact:
summarised or encrypted reasoning, tool arguments that arrived as parsed JSON instead of the
verbatim string, unparseable tool-call arrays, failed requests, answers a secret was cut out of.

Pure: a dict row in, a `Normalised` out. No tokenizer here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

FINISHED = ("stop", "tool_calls", "length")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str      # verbatim string as received: never re-serialised
    id: str | None


@dataclass(frozen=True)
class Parts:
    reasoning: str | None
    content: str
    tool_calls: tuple[Call, ...]
    truncated: bool


@dataclass(frozen=True)
class Normalised:
    parts: Parts | None                 # None when quarantined before rendering
    normalisations: tuple[str, ...]     # codes, in the order applied
    quarantine: str | None = None       # reason code, or None when usable


@dataclass(frozen=True)
class Dialect:
    """What normalisation needs to know about the template (kept tokenizer-free)."""
    think: tuple[str, str] | None       # literal marker texts, e.g. ("<think>", "</think>")
    # Kimi: restore `functions.NAME:IDX` ids; (raw_id, name, idx) -> model's own id.
    tool_id: Callable[[str | None, str, int], str | None] | None = None
    # Tool calls already in the prompt (Kimi numbers calls across the conversation).
    first_tool_index: int = 0


def normalise(row: dict[str, Any], dialect: Dialect) -> Normalised:
    done: list[str] = []
    if row.get("status") != "ok":
        reason = row.get("failure_reason") or "unknown"
        return Normalised(None, (), f"response_failed:{reason}")
    if row.get("redacted"):
        # The client cut a secret (the API key) out of this answer: its text is no longer what
        # the model produced (client/redact.py).
        return Normalised(None, (), "secret_in_output")
    finish = row.get("finish_reason")
    if finish not in FINISHED:
        # content_filter / error / None: the text is not a whole model output.
        return Normalised(None, (), f"finish_reason_{finish}")

    reasoning, quarantine = _reasoning(row, done)
    if quarantine:
        return Normalised(None, tuple(done), quarantine)
    content = row.get("content") or ""
    if not reasoning and dialect.think:
        reasoning, content = _reasoning_from_content(content, dialect.think, done)

    calls, quarantine = _tool_calls(row.get("tool_calls"), dialect, done)
    if quarantine:
        return Normalised(None, tuple(done), quarantine)
    parts = Parts(reasoning=reasoning or None, content=content, tool_calls=calls,
                  truncated=finish == "length")
    return Normalised(parts, tuple(done))


def _reasoning(row: dict[str, Any], done: list[str]) -> tuple[str | None, str | None]:
    reasoning = row.get("reasoning")
    raw = row.get("reasoning_details")
    if raw in (None, ""):
        return reasoning, None
    try:
        details = json.loads(raw)
    except json.JSONDecodeError:
        return None, "reasoning_details_unparseable"
    if not isinstance(details, list):
        return None, "reasoning_details_unparseable"
    kinds = {d.get("type") for d in details if isinstance(d, dict)}
    # A summary or an encrypted blob is not what the model generated: no tokenization of it can
    # be exact, whatever `reasoning` holds (OpenRouter fills `reasoning` from the summary).
    if "reasoning.encrypted" in kinds:
        return None, "reasoning_encrypted"
    if "reasoning.summary" in kinds:
        return None, "reasoning_summary"
    unknown = kinds - {"reasoning.text"}
    if unknown:
        return None, "reasoning_details_unknown_type"
    text = "".join(d.get("text") or "" for d in details)
    if reasoning:
        if text and text != reasoning:
            # Two versions of the same reasoning disagree: no way to tell which is the model's.
            return None, "reasoning_details_disagree"
        return reasoning, None
    if text:
        done.append("reasoning_from_details")
    return text, None


def _reasoning_from_content(content: str, think: tuple[str, str],
                            done: list[str]) -> tuple[str | None, str]:
    open_, close = think
    head = content.lstrip()
    if head.startswith(open_):
        body = head[len(open_):]
        if close in body:
            reasoning, _, rest = body.partition(close)
            done.append("reasoning_from_content")
            return reasoning, rest
        # Opened and never closed: truncated inside the reasoning (or a broken output; the
        # flags and the comparison with truth say which).
        done.append("reasoning_from_content_unclosed")
        return body, ""
    if close in content and open_ not in content.partition(close)[0]:
        # The generation prompt prefilled the opening marker (Kimi-K2.5, Qwen3 thinking), so
        # the provider only saw the closing one.
        reasoning, _, rest = content.partition(close)
        done.append("reasoning_from_content_prefilled")
        return reasoning, rest
    return None, content


def _tool_calls(raw: str | None, dialect: Dialect,
                done: list[str]) -> tuple[tuple[Call, ...], str | None]:
    if raw in (None, ""):
        return (), None
    try:
        items = json.loads(raw)
    except json.JSONDecodeError:
        return (), "tool_calls_unparseable"
    if not isinstance(items, list):
        return (), "tool_calls_unparseable"
    calls = []
    for i, item in enumerate(items):
        fn = item.get("function") if isinstance(item, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return (), "tool_calls_unparseable"
        args = fn.get("arguments")
        if not isinstance(args, str):
            # Parsed JSON instead of the string: re-serialising it would invent bytes.
            return (), "tool_arguments_not_string"
        raw_id = item.get("id")
        call_id = raw_id
        if dialect.tool_id is not None:
            call_id = dialect.tool_id(raw_id, fn["name"], dialect.first_tool_index + i)
            if call_id != raw_id:
                done.append("tool_id_restored")
        calls.append(Call(fn["name"], args, call_id))
    return tuple(calls), None
