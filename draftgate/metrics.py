"""Per-stage metrics: rows in/out, drops per reason, key figures, resolved params.

Every stage writes them through `StageMetrics.write(path)` as two files:
- `metrics/<stage>.json`, a DVC metric: the numbers only (counts, rates, figures, flags), so
  `dvc metrics show` prints a table of figures, not text;
- `metrics/<stage>.details.json` beside it (details_path): everything, the text included (resolved
  params, names, hashes, examples, lists).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgate.io import write_json


@dataclass
class StageMetrics:
    stage: str
    rows_in: int = 0
    rows_out: int = 0
    drops: Counter = field(default_factory=Counter)
    figures: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)

    def drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] += n

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "dropped": sum(self.drops.values()),
            "drops_by_reason": dict(sorted(self.drops.items())),
            **self.figures,
            "params": self.params,
        }

    def write(self, path: str | Path) -> None:
        """The metric at `path`, the details beside it; the details first, so a metric (what DVC and
        the next stage read) never stands without them."""
        full = self.to_dict()
        write_json(details_path(path), full)
        write_json(path, numbers({k: v for k, v in full.items() if k != "params"}))


def details_path(path: str | Path) -> Path:
    """metrics/generate.json -> metrics/generate.details.json"""
    path = Path(path)
    return path.with_name(f"{path.stem}.details.json")


def numbers(value: dict) -> dict:
    """The numeric part of a JSON object: ints, finite floats and booleans, nested objects kept.

    Text, lists and nulls are left out (DVC prints text as columns, and skips lists anyway). An
    object that held only text disappears; an empty one (no drops yet) stays as it was.
    """
    out = {}
    for key, v in value.items():
        if isinstance(v, dict):
            inner = numbers(v)
            if inner or not v:
                out[key] = inner
        elif isinstance(v, (bool, int)) or isinstance(v, float) and math.isfinite(v):
            out[key] = v
    return out
