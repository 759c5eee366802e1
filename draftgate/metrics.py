"""Per-stage metrics: rows in/out, drops per reason, key figures, resolved params.

Every stage writes them through `StageMetrics.write(path)` as two files:
- `metrics/<stage>.json`, a DVC metric: the numbers only (counts, rates, figures, flags), so
  `dvc metrics show` prints a table of figures, not text; and of those, only what describes the
  data: wall-clock, throughput and how the run went (RUN_FIGURES) change on every run and would
  fill `dvc metrics diff` and `dvc exp show --only-changed` with noise; nor the breakdowns
  (BREAKDOWNS: per dataset, mode, provider, position, step or setting), nor what a stage names as
  its own details (`StageMetrics.details_only`): DVC prints one table for every metric file, one
  column per key of any of them, and eval's breakdowns alone made 200 columns (13,400 characters
  a line);
- `metrics/<stage>.details.json` beside it (details_path): everything, the text included (resolved
  params, names, hashes, examples, lists).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgate.io import write_json


# Figures about the run, not the data: wall-clock and throughput (elapsed_s, tokens_per_s, a
# phase's seconds), the machine's shape (world_size, threads) and how a rerun resumed or retried.
# Kept in the details only.
RUN_FIGURES = re.compile(r"(_s|_per_s|^seconds|^world_size|^threads|^resumed_\w+|^computed_shards|^removed_\w+"
                         r"|^forward_batches|^pauses_429|^refused_retries|^lost_attempts|^reservations)$")
# Breakdowns of a headline figure: per dataset, serving mode or provider, per draft position or
# training step, per setting of a sweep or per proposer run, a histogram, and a run's settings (in
# the params already). Each is a block of columns in `dvc metrics show` (eval's `runs` repeated
# drafter/ngram under their setting names: 117 columns); they are in the details, and the
# per-position and per-dataset ones in plots/ too.
BREAKDOWNS = re.compile(r"^(runs|by_dataset|by_mode|by_provider|per_position|per_position_all|step_accuracy"
                        r"|proxy_step_accuracy|sweep_replayed|repetition_tenths|length_rate_by_dataset|phases"
                        r"|settings|accuracy_last)$")


@dataclass
class StageMetrics:
    stage: str
    rows_in: int = 0
    rows_out: int = 0
    drops: Counter = field(default_factory=Counter)
    figures: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    # Keys (at any depth) that this stage keeps in its details only, beside RUN_FIGURES and
    # BREAKDOWNS: counts that restate the inputs, second definitions of a figure.
    details_only: tuple[str, ...] = ()

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
        write_json(path, metric(full, self.details_only))


def metric(full: dict, details_only: tuple[str, ...] = ()) -> dict:
    """What DVC shows of a stage's figures: the numbers, less the run's own figures, the breakdowns,
    the params and the stage's `details_only` keys."""
    parts = [RUN_FIGURES.pattern, BREAKDOWNS.pattern]
    if details_only:
        parts.append("^(" + "|".join(re.escape(k) for k in details_only) + ")$")
    return numbers({k: v for k, v in full.items() if k != "params"}, re.compile("|".join(parts)))


def details_path(path: str | Path) -> Path:
    """metrics/generate.json -> metrics/generate.details.json"""
    path = Path(path)
    return path.with_name(f"{path.stem}.details.json")


def numbers(value: dict, leave_out: re.Pattern | None = None) -> dict:
    """The numeric part of a JSON object: ints, finite floats and booleans, nested objects kept;
    keys matching `leave_out` left out at any depth.

    Text, lists and nulls are left out (DVC prints text as columns, and skips lists anyway). An
    object that held only text disappears; an empty one (no drops yet) stays as it was.
    """
    out = {}
    for key, v in value.items():
        if leave_out is not None and leave_out.search(str(key)):
            continue
        if isinstance(v, dict):
            inner = numbers(v, leave_out)
            if inner or not v:
                out[key] = inner
        elif isinstance(v, (bool, int)) or isinstance(v, float) and math.isfinite(v):
            out[key] = v
    return out
