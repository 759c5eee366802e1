"""Side tables a suite computes before GX runs: for checks SQL cannot make (a forward pass, logits).

A suite names a registered producer (`"compute": "hidden"`); the producer reads the raw artifacts
of the gate's named inputs (tensors, weights) and returns Arrow tables that the suite's `view`
reads like any input, plus a JSON report kept in the gate's result file (`computed.report`).
Judgement stays in the suite: a producer measures (hashes, shapes, hits, errors) and the view and
its expectations decide, with thresholds from params.yaml like every other gate.

Producers are named here, not by a module path in the suite, so a suite file cannot make the
gate import arbitrary code. Each is imported only when its suite runs (torch is heavy).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Any

from draftgate.gates.suite import GateError

# name -> "module:function"; the function takes (inputs: dict[str, str], params_path: str) and
# returns Computed.
PRODUCERS = {
    "hidden": "draftgate.gates.hidden:compute",
    "eval": "draftgate.gates.eval:compute",
    "drafter": "draftgate.gates.drafter:compute",
}


@dataclass
class Computed:
    tables: dict[str, Any]                       # relation name -> pyarrow.Table, for the view
    report: dict[str, Any] = field(default_factory=dict)   # JSON-safe figures for the result file


def run_producer(name: str, inputs: dict[str, str], params_path: str) -> tuple[Computed, float]:
    """Run producer `name` on the gate's inputs; (what it computed, seconds)."""
    if name not in PRODUCERS:
        raise GateError(f"suite \"compute\": unknown producer {name!r}; registered: {', '.join(sorted(PRODUCERS))} "
                        "(draftgate/gates/compute.py)")
    module, _, func = PRODUCERS[name].partition(":")
    start = time.perf_counter()
    computed = getattr(importlib.import_module(module), func)(inputs, params_path)
    clash = sorted(set(computed.tables) & set(inputs))
    if clash:
        raise GateError(f"producer {name!r} computes {clash[0]!r}, which is also an input name; rename the input")
    return computed, time.perf_counter() - start
