"""Compare reconstructed ids with the ids the model produced.

`exact`: same ids. `bpe_only`: different ids, same bytes (a different split of the same text:
harmless for the text, fatal for a drafter trained on the wrong ids). `semantic`: the bytes
differ (the provider's text is not what the model generated). `unknown`: no reference ids.
Bytes, not `str`, are compared: two splits of a multi-byte character can decode to the same
replacement characters while being different bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

WINDOW = 8  # tokens each side of the first difference kept for review


@dataclass(frozen=True)
class Comparison:
    match: str                  # exact | bpe_only | semantic | unknown
    first_diff: int | None      # first differing position in the completion
    context: str | None         # JSON: both sides around first_diff
    # Tokens between the common prefix and the common suffix: how much of the row a drafter
    # trained on the candidate would learn differently (candidate side, reference side).
    span: tuple[int, int] = (0, 0)


UNKNOWN = Comparison("unknown", None, None)   # frozen: one instance serves every row


def compare(candidate: Sequence[int], reference: Sequence[int] | None,
            token_bytes: Callable[[int], bytes]) -> Comparison:
    if reference is None:
        return UNKNOWN
    candidate, reference = list(candidate), list(reference)
    if candidate == reference:
        return Comparison("exact", None, None)
    pos = first_difference(candidate, reference)
    same = _bytes(candidate, token_bytes) == _bytes(reference, token_bytes)
    return Comparison("bpe_only" if same else "semantic", pos,
                      _context(candidate, reference, pos, token_bytes),
                      differing_span(candidate, reference, pos))


def differing_span(a: Sequence[int], b: Sequence[int], start: int) -> tuple[int, int]:
    """Tokens of a and of b left once the common prefix (start) and common suffix are cut."""
    limit = min(len(a), len(b)) - start
    tail = 0
    while tail < limit and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    return len(a) - start - tail, len(b) - start - tail


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _bytes(ids: Sequence[int], token_bytes: Callable[[int], bytes]) -> bytes:
    return b"".join(token_bytes(i) for i in ids)


def _context(candidate: list[int], reference: list[int], pos: int,
             token_bytes: Callable[[int], bytes]) -> str:
    lo = max(0, pos - WINDOW)

    def side(ids: list[int]) -> dict:
        window = ids[lo:pos + WINDOW]
        return {"ids": window, "text": _bytes(window, token_bytes).decode("utf-8", "replace"),
                "pieces": [token_bytes(i).decode("utf-8", "backslashreplace") for i in window]}

    return json.dumps({"pos": pos, "from": lo, "text_method": side(candidate),
                       "truth": side(reference)}, ensure_ascii=False)
