"""A bench's verdict on its own targets: `make bench` stops at the first bench below one.

Each bench states its targets as named booleans (nested dicts allowed: scale.py's per stage) and
returns `verdict(...)` from main: 0 when every target is met, 1 naming the missed ones. A wrong
result (ids that differ, verdicts that disagree) is a failure of its own, before any target.
"""

from __future__ import annotations

import sys
from typing import Iterator, Mapping


def _flat(met: Mapping, prefix: str = "") -> Iterator[tuple[str, bool]]:
    for k, v in met.items():
        if isinstance(v, Mapping):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", bool(v)


def verdict(bench: str, met: Mapping) -> int:
    flat = dict(_flat(met))
    missed = [k for k, ok in flat.items() if not ok]
    if missed:
        print(f"{bench}: BELOW TARGET: {', '.join(missed)} (of {len(flat)} targets)", file=sys.stderr)
        return 1
    print(f"{bench}: all {len(flat)} targets met")
    return 0
