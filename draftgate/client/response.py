"""Parse a chat-completions body into a typed record, keeping model-produced JSON byte-exact.

`tool_calls`, `reasoning_details` and `logprobs` are sliced from the raw body text, never
re-serialised: a provider's `arguments` strings (odd spacing, key order, escapes) survive as sent.
Leading whitespace keep-alive bytes (OpenRouter sends them while a request is queued) are skipped.

Junk outputs: a 200 whose content is not a model's answer but a provider's leaked error
(`leaked_error_body`) or a serialised list of content parts (`content_parts_repr`) is a BadBody
carrying the parsed completion, so the paid answer is journaled as received and retried
(`junk_reason` is the rule; expectations/responses.json recomputes the same rule in SQL).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace
from json.decoder import scanstring
from typing import Any

from draftgate.client.redact import holds_secret, redact, replace_secrets, scrub_bytes

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"

# Content-part `type`s of OpenAI chat, OpenAI Responses, Anthropic and OpenRouter reasoning details:
# a content that is nothing but a list of these is a serialised message, not an answer.
PART_TYPES = ("text", "output_text", "input_text", "refusal", "image_url", "input_image", "image",
              "input_audio", "file", "thinking", "redacted_thinking", "reasoning.text",
              "reasoning.summary", "reasoning.encrypted")
# The Python repr of such a list (`[{'type': 'text', 'text': '...'}]`) is not JSON. Whitespace is
# spelled [ \t\n\r] rather than \s so that Python's re and DuckDB's RE2 read the rule alike.
_SP = r"[ \t\n\r]*"
_Q = "['\"]"
PARTS_REPR_RE = (rf"(?s)^{_SP}\[{_SP}\{{.*{_Q}type{_Q}{_SP}:{_SP}{_Q}"
                 rf"(?:{'|'.join(re.escape(t) for t in PART_TYPES)}){_Q}.*\}}{_SP}\]{_SP}$")
_PARTS_REPR = re.compile(PARTS_REPR_RE)


class BadBody(ValueError):
    """A 200 whose body is not a usable completion; `cause` is the retry cause.

    `usage`: a billed-but-useless answer still costs money. `completion`: the parsed answer when
    there was one (empty or junk output), kept so the journal holds what was paid for.
    """

    def __init__(self, cause: str, detail: str, usage: dict[str, Any] | None = None,
                 completion: "Completion | None" = None, error: "ErrorInfo | None" = None):
        super().__init__(f"{cause}: {detail}")
        self.cause, self.detail = cause, detail
        self.usage = usage
        self.completion = completion
        self.error = error


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
    # Fields a secret was cut out of (scrub); empty when none held one.
    redacted: tuple[str, ...] = ()


# The model's own output: a secret in any of these means the answer can no longer be rebuilt
# exactly (the row is quarantined downstream: redact.py).
MODEL_OUTPUT = ("reasoning", "reasoning_details", "content", "tool_calls", "logprobs", "token_ids")
RAW_JSON = ("reasoning_details", "tool_calls", "logprobs")   # kept as source text (raw_span)
# These spell the output token by token, so a secret cut out of the text would survive in them
# in pieces: an answer whose text held one keeps neither (it is quarantined anyway).
SPELLED = ("logprobs", "token_ids")


def scrub(comp: Completion, secrets: tuple[str, ...]) -> Completion:
    """`comp` without the secrets, naming the fields they were cut out of in `redacted`.

    Exact string replacement on each field as received: on the decoded text of the string
    fields, on the source text of the raw JSON ones (so nothing is re-serialised). A raw JSON
    field that still decodes to a secret held it escaped (`\\u0073k-...`): it is rebuilt from its
    redacted value, which is why the row is quarantined and never rebuilt from it.
    """
    if not secrets:
        return comp
    changed: dict[str, Any] = {}
    for f in fields(Completion):
        value = getattr(comp, f.name)
        if value is None or f.name == "redacted":
            continue
        if isinstance(value, str):
            new = replace_secrets(value, secrets)
            if f.name in RAW_JSON and "\\" in new:
                decoded = json.loads(new)
                if holds_secret(decoded, secrets):
                    new = json.dumps(redact(decoded, secrets, patterns=False), ensure_ascii=False)
        elif holds_secret(value, secrets):
            new = redact(value, secrets, patterns=False)
        else:
            continue
        if new is not value and new != value:
            changed[f.name] = new
    if not changed:
        return comp
    if set(changed) & set(MODEL_OUTPUT):
        changed.update({k: None for k in SPELLED if getattr(comp, k) is not None})
    return replace(comp, **changed, redacted=tuple(sorted(changed)))


@dataclass(frozen=True)
class ErrorInfo:
    """What an error body says, any status: `{error: {code, message, metadata}}` (+ `usage`)."""
    message: str
    metadata: dict[str, Any]        # error.metadata as sent (OpenRouter: provider_name, raw, limit_source)
    provider: str | None            # error.metadata.provider_name, else the body's `provider`
    usage: dict[str, Any] | None    # a billed error: its cost is wasted spend


def parse_completion(raw: bytes, secrets: tuple[str, ...] = ()) -> Completion:
    """Raise BadBody(cause) for a 200 that must be retried: error body, empty or junk output, ...

    `secrets`: cut out of every field (scrub) before anything, a BadBody's detail included, is
    derived from the answer."""
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise BadBody("malformed_json", f"{e} (first bytes: {scrub_bytes(raw, secrets)[:80]!r})") from None
    if not isinstance(obj, dict):
        raise BadBody("malformed_json", f"top level is {type(obj).__name__}, not an object")
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    if usage is not None and holds_secret(usage, secrets):
        usage = redact(usage, secrets, patterns=False)
    if obj.get("error") is not None:
        info = _error_info(redact(obj, secrets, patterns=False) if secrets else obj)
        raise BadBody("error_body", info.message, usage, error=info)
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadBody("no_choices", "body has no choices[0]", usage)
    choice = choices[0]
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content, reasoning = message.get("content"), message.get("reasoning")
    calls, details = message.get("tool_calls"), message.get("reasoning_details")
    path = ("choices", 0, "message")
    token_ids = choice.get("token_ids")
    comp = Completion(
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
    comp = scrub(comp, secrets)
    content, reasoning = comp.content, comp.reasoning
    if comp.finish_reason == "error":
        raise BadBody("finish_error", f"finish_reason error (native: {comp.native_finish_reason})", usage, comp)
    if not content and not reasoning and not calls and not details:
        raise BadBody("empty_output", f"no content, reasoning or tool calls "
                                      f"(finish_reason {comp.finish_reason})", usage, comp)
    junk = junk_reason(content)
    if junk is not None:
        raise BadBody(junk, f"content is {_JUNK_TEXT[junk]} (provider {comp.provider}): {content[:200]!r}",
                      usage, comp)
    return comp


_JUNK_TEXT = {"leaked_error_body": "a provider error body, not an answer",
              "content_parts_repr": "a serialised list of content parts, not their text"}


def junk_reason(content: Any) -> str | None:
    """`leaked_error_body`, `content_parts_repr` or None: is this content junk rather than an answer?

    - leaked_error_body: the content (JSON whitespace trimmed) parses as a JSON object with a
      non-null `error` member, or with `"object": "error"` (vLLM's error shape).
    - content_parts_repr: it parses as a non-empty JSON array of objects whose `type` is a string
      in PART_TYPES; or it is not JSON and matches PARTS_REPR_RE (a Python repr of that list).
    An answer that is wholly such JSON cannot be told from a leak; it fails visibly (retried, then
    a failed row with the reason), never silently.
    """
    if not isinstance(content, str):
        return None
    s = content.strip(_WS)
    if not s or s[0] not in "[{":   # most answers are prose: one character decides
        return None
    try:
        obj = json.loads(s, parse_constant=_reject_constant)
    except ValueError:
        return "content_parts_repr" if _PARTS_REPR.match(s) else None
    if isinstance(obj, dict):
        return "leaked_error_body" if obj.get("error") is not None or obj.get("object") == "error" else None
    if isinstance(obj, list) and obj and all(
            isinstance(e, dict) and isinstance(e.get("type"), str) and e["type"] in PART_TYPES for e in obj):
        return "content_parts_repr"
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")   # as DuckDB's json_valid says: keeps both rules alike


def error_info(raw: bytes, secrets: tuple[str, ...] = ()) -> ErrorInfo:
    """The error body of a non-2xx answer, tolerating anything that is not one; `secrets` are
    cut out of the raw bytes and, where JSON escapes hid them there, out of the parsed values."""
    raw = scrub_bytes(raw, secrets)
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return ErrorInfo(raw[:200].decode("utf-8", "replace"), {}, None, None)
    if secrets and holds_secret(obj, secrets):
        obj = redact(obj, secrets, patterns=False)
    if not isinstance(obj, dict):
        return ErrorInfo(str(obj)[:200], {}, None, None)
    return _error_info(obj)


def _error_info(obj: dict[str, Any]) -> ErrorInfo:
    err = obj.get("error")
    meta = err.get("metadata") if isinstance(err, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    provider = meta.get("provider_name") or obj.get("provider")
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    return ErrorInfo(_error_text(err), meta, provider if isinstance(provider, str) else None, usage)


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
