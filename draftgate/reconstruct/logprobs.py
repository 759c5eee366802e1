"""Method `logprobs`: token bytes returned with each sampled token -> ids.

The map is exact or refused: it is built from every id's bytes in the vocabulary, and a byte
string that two ids share is ambiguous (a row that needs it falls back to the text method with
the reason). Bytes come from each entry's `bytes` field (OpenAI shape); a character split over
two tokens shows up as two entries with partial bytes, which is exactly what we need; the
`token` string is only trusted when it carries no replacement character.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_BYTES_TOKEN = re.compile(r"\\x([0-9a-fA-F]{2})")


@dataclass(frozen=True)
class Lookup:
    ids: tuple[int, ...] | None
    reason: str | None      # why no ids: logprobs_unparseable | _no_bytes | _unmapped | _ambiguous


class BytesIndex:
    """bytes -> id over the whole vocabulary; built once per tokenizer (~0.2 s for 151k ids)."""

    def __init__(self, token_bytes: Any, size: int):
        index: dict[bytes, int] = {}
        ambiguous: set[bytes] = set()
        for i in range(size):
            b = token_bytes(i)
            if b in index:
                ambiguous.add(b)
            index[b] = i
        self.index = index
        self.ambiguous = frozenset(ambiguous)

    def lookup(self, raw: str | None) -> Lookup:
        if raw in (None, ""):
            return Lookup(None, "logprobs_absent")
        try:
            entries = json.loads(raw)["content"]
        except (json.JSONDecodeError, KeyError, TypeError):
            return Lookup(None, "logprobs_unparseable")
        if not isinstance(entries, list) or not entries:
            return Lookup(None, "logprobs_unparseable")
        ids = []
        for e in entries:
            b = _entry_bytes(e)
            if b is None:
                return Lookup(None, "logprobs_no_bytes")
            if b in self.ambiguous:
                return Lookup(None, "logprobs_ambiguous")
            i = self.index.get(b)
            if i is None:
                return Lookup(None, "logprobs_unmapped")
            ids.append(i)
        return Lookup(tuple(ids), None)


def _entry_bytes(e: Any) -> bytes | None:
    if not isinstance(e, dict):
        return None
    raw = e.get("bytes")
    if isinstance(raw, list) and all(isinstance(x, int) and 0 <= x < 256 for x in raw):
        return bytes(raw)
    tok = e.get("token")
    if not isinstance(tok, str):
        return None
    if tok.startswith("bytes:"):
        # vLLM's spelling of a token that is not valid UTF-8 on its own: bytes:\xe4\xbd
        rest = tok[len("bytes:"):]
        if _BYTES_TOKEN.sub("", rest) == "":
            return bytes(int(h, 16) for h in _BYTES_TOKEN.findall(rest))
        return None
    if "\ufffd" in tok:
        return None
    return tok.encode("utf-8")
