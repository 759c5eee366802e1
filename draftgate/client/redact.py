"""Keep secrets out of everything the client writes: journal lines, the table, metrics, logs.

What counts as a secret: the run's own key (Target.api_key), the value of the variable
`generate.api_key_env` names (even when nothing sends it: a local backend with the OpenRouter key
in the environment), and any header value the client sends under a credential-like name
(`Target.secrets`). A provider can echo any of them back anywhere: in an error's metadata, in an
ok answer's content, reasoning, tool-call arguments or `provider` field.

Rules:
- The secrets themselves are replaced by exact string replacement, wherever they appear: in the
  raw body before anything is parsed from it (error bodies, details, the first bytes quoted in an
  error) and in every parsed field of an answer (response.scrub), where the JSON escapes of a
  body are already undone. Model output is otherwise kept exactly as received.
- In error metadata only (provider-controlled text, never model output): members whose name says
  they hold a credential are replaced whole, and bearer tokens and `sk-...` style keys in any
  string, even when they are not this run's (`patterns`).
- The journal writer checks every encoded line for the secrets and redacts any that still holds
  one (journal.Journal): a field a future change forgets cannot leak.

An answer whose model output held a secret cannot be rebuilt exactly any more: its journal line
names the fields in `redacted`, the table says `redacted = true`, and reconstruct quarantines the
row (`secret_in_output`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

REDACTED = "[redacted]"
_SECRET_NAME = re.compile(r"authorization|api[-_]?key|secret|password|cookie|credential", re.I)
_SECRET_TEXT = re.compile(r"(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}")


def secret_header(name: str) -> bool:
    """Whether a header of this name carries a credential (Authorization, X-Api-Key, Cookie, ...)."""
    return bool(_SECRET_NAME.search(name))


def secrets_of(values: Iterable[str | None]) -> tuple[str, ...]:
    """The distinct non-empty secrets, longest first: a secret that contains another is replaced
    whole before the shorter one could cut it in two."""
    return tuple(sorted({v for v in values if v}, key=lambda s: (-len(s), s)))


def redact(value: Any, secrets: tuple[str, ...] = (), patterns: bool = True) -> Any:
    """A copy of `value` (JSON-like) without secrets; `secrets` are exact strings to remove.

    patterns=False applies only the exact `secrets`: for model output, which may legitimately
    contain `Bearer ...` in a code sample and must otherwise stay as received.
    """
    if isinstance(value, str):
        value = replace_secrets(value, secrets)
        return _SECRET_TEXT.sub(REDACTED, value) if patterns else value
    if isinstance(value, dict):
        return {replace_secrets(k, secrets) if isinstance(k, str) else k:
                REDACTED if patterns and isinstance(k, str) and _SECRET_NAME.search(k) and v not in (None, "")
                else redact(v, secrets, patterns) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets, patterns) for v in value]
    return value


def replace_secrets(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with every secret replaced; the same object when it holds none."""
    for s in secrets:
        if s and s in text:
            text = text.replace(s, REDACTED)
    return text


def scrub_bytes(raw: bytes, secrets: tuple[str, ...]) -> bytes:
    """Raw bytes (a response body) with every secret replaced; the same object when none is there."""
    for s in secrets:
        b = s.encode("utf-8", "surrogatepass")
        if b and b in raw:
            raw = raw.replace(b, REDACTED.encode())
    return raw


def holds_secret(value: Any, secrets: tuple[str, ...]) -> bool:
    """Whether any string of `value` (JSON-like; dict keys too) contains a secret."""
    if not secrets:
        return False
    if isinstance(value, str):
        return any(s in value for s in secrets)
    if isinstance(value, dict):
        return any(holds_secret(k, secrets) or holds_secret(v, secrets) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(holds_secret(v, secrets) for v in value)
    return False


def line_needles(secrets: tuple[str, ...]) -> tuple[bytes, ...]:
    """What a secret looks like inside an encoded JSON line: as is, and JSON-escaped (a secret with
    a quote, a backslash or a control character is written escaped)."""
    out = set()
    for s in secrets:
        out.add(s.encode("utf-8", "surrogatepass"))
        out.add(json.dumps(s, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass"))
        out.add(json.dumps(s)[1:-1].encode())
    return tuple(sorted(out, key=len, reverse=True))


def redact_record(record: dict[str, Any], secrets: tuple[str, ...]) -> dict[str, Any]:
    """A journal line without the secrets, every field; the fields they were in are added to its
    `redacted` list (for an ok answer's model output: the row is quarantined downstream)."""
    clean = redact(record, secrets, patterns=False)
    hit = {k for k, v in record.items() if clean.get(k) != v}
    if hit:
        clean["redacted"] = sorted(hit | set(record.get("redacted") or ()))
    return clean
