"""Parse a chat-completions body into a typed record, keeping model-produced JSON byte-exact.

`tool_calls`, `reasoning_details` and `logprobs` are sliced from the raw body text, never
re-serialised: a provider's `arguments` strings (odd spacing, key order, escapes) survive as sent.
Leading whitespace keep-alive bytes (OpenRouter sends them while a request is queued) are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Any

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


class BadBody(ValueError):
    """A 200 whose body is not a usable completion; `cause` is the retry cause."""

    def __init__(self, cause: str, detail: str, usage: dict[str, Any] | None = None):
        super().__init__(f"{cause}: {detail}")
        self.cause, self.detail = cause, detail
        self.usage = usage   # a billed-but-useless answer still costs money


@dataclass(frozen=True)
class Completion:
    generation_id: str | None
    provider: str | None
    model: str | None
    finish_reason: str | None
    native_finish_reason: str | None
    reasoning: str | None
    reasoning_details: str | None   # raw JSON text
    content: str | None
    tool_calls: str | None          # raw JSON text of the array
    usage: dict[str, Any] | None
    logprobs: str | None            # raw JSON text
    token_ids: list[int] | None
    prompt_token_ids: list[int] | None


def parse_completion(raw: bytes) -> Completion:
    """Raise BadBody(cause) for a 200 that must be retried: error body, empty output, ..."""
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise BadBody("malformed_json", f"{e} (first bytes: {raw[:80]!r})") from None
    if not isinstance(obj, dict):
        raise BadBody("malformed_json", f"top level is {type(obj).__name__}, not an object")
    if obj.get("error") is not None:
        raise BadBody("error_body", _error_text(obj["error"]))
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadBody("no_choices", "body has no choices[0]")
    choice = choices[0]
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    if choice.get("finish_reason") == "error":
        raise BadBody("finish_error", f"finish_reason error (native: {choice.get('native_finish_reason')})", usage)
    content, reasoning = message.get("content"), message.get("reasoning")
    calls, details = message.get("tool_calls"), message.get("reasoning_details")
    if not content and not reasoning and not calls and not details:
        raise BadBody("empty_output", f"no content, reasoning or tool calls "
                                      f"(finish_reason {choice.get('finish_reason')})", usage)
    path = ("choices", 0, "message")
    token_ids = choice.get("token_ids")
    return Completion(
        generation_id=obj.get("id"), provider=obj.get("provider"), model=obj.get("model"),
        finish_reason=choice.get("finish_reason"), native_finish_reason=choice.get("native_finish_reason"),
        reasoning=reasoning, content=content,
        reasoning_details=raw_span(text, path + ("reasoning_details",)) if details is not None else None,
        tool_calls=raw_span(text, path + ("tool_calls",)) if calls is not None else None,
        logprobs=raw_span(text, ("choices", 0, "logprobs")) if choice.get("logprobs") is not None else None,
        usage=usage,
        token_ids=token_ids if isinstance(token_ids, list) else None,
        prompt_token_ids=obj.get("prompt_token_ids") if isinstance(obj.get("prompt_token_ids"), list) else None,
    )


def error_info(raw: bytes) -> tuple[str, dict[str, Any]]:
    """(message, metadata) of an error body, tolerating anything that is not one."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return raw[:200].decode("utf-8", "replace"), {}
    if not isinstance(err, dict):
        return _error_text(err), {}
    meta = err.get("metadata")
    return _error_text(err), meta if isinstance(meta, dict) else {}


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        return f"{err.get('code')}: {str(err.get('message'))[:300]}"
    return str(err)[:300]


def raw_span(text: str, path: tuple[str | int, ...]) -> str | None:
    """The exact source text of the JSON value at `path`, or None when absent.

    Duplicate keys resolve like json.loads (the last one wins). Values off the path are skipped
    with the C decoder, so this costs about one extra parse of what it walks past.
    """
    i = _skip(text, 0)
    for step in path:
        i = _member(text, i, step) if isinstance(step, str) else _element(text, i, step)
        if i is None:
            return None
    _, end = _DECODER.raw_decode(text, i)
    return text[i:end]


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _member(text: str, i: int, key: str) -> int | None:
    if text[i] != "{":
        return None
    i = _skip(text, i + 1)
    found = None
    if text[i] == "}":
        return None
    while True:
        name, i = scanstring(text, i + 1)
        i = _skip(text, _skip(text, i) + 1)   # past ':'
        if name == key:
            found = i
        _, i = _DECODER.raw_decode(text, i)
        i = _skip(text, i)
        if text[i] == "}":
            return found
        i = _skip(text, i + 1)                 # past ','


def _element(text: str, i: int, index: int) -> int | None:
    if text[i] != "[":
        return None
    i = _skip(text, i + 1)
    if text[i] == "]":
        return None
    n = 0
    while True:
        if n == index:
            return i
        _, i = _DECODER.raw_decode(text, i)
        i = _skip(text, i)
        if text[i] == "]":
            return None
        i = _skip(text, i + 1)
        n += 1
