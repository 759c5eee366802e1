"""Per-stage metrics: rows in/out, drops per reason, key figures, resolved params.

Every stage writes one `metrics/<stage>.json` (a DVC metric) through `StageMetrics`.
"""

from __future__ import annotations

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
        write_json(path, self.to_dict())
