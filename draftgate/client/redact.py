"""Keep secrets out of what the journal stores from error bodies.

Error metadata is provider-controlled text (OpenRouter's `error.metadata.raw` is the upstream
provider's own error, verbatim); a provider echoing a request header back would otherwise put a
key on disk. Three rules: the run's own key is replaced wherever it appears; members whose name says
they hold a credential are replaced whole; bearer tokens and `sk-...` style keys are replaced in
any string. Everything else is kept as sent.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"
_SECRET_NAME = re.compile(r"authorization|api[-_]?key|secret|password|cookie|credential", re.I)
_SECRET_TEXT = re.compile(r"(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}")


def redact(value: Any, secrets: tuple[str, ...] = (), patterns: bool = True) -> Any:
    """A copy of `value` (JSON-like) without secrets; `secrets` are exact strings to remove.

    patterns=False applies only the exact `secrets`: for model output, which may legitimately
    contain `Bearer ...` in a code sample and must otherwise stay as received.
    """
    if isinstance(value, str):
        for s in secrets:
            if s:
                value = value.replace(s, REDACTED)
        return _SECRET_TEXT.sub(REDACTED, value) if patterns else value
    if isinstance(value, dict):
        return {k: REDACTED if patterns and isinstance(k, str) and _SECRET_NAME.search(k) and v not in (None, "")
                else redact(v, secrets, patterns) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets, patterns) for v in value]
    return value
