"""Side tables a suite computes before GX runs: for checks SQL cannot make (a forward pass, logits).

A suite names the check it needs (`"compute": "hidden"`); the gate stage that runs it hands the
engine that check as a function (stages/gate_hidden.py passes draftgate.checks.hidden.compute).
The check reads the raw artifacts of the gate's named inputs (tensors, weights) and returns Arrow
tables that the suite's `view` reads like any input, plus a JSON report kept in the gate's result
file (`computed.report`); a report's `tables` (name -> {"note", "columns", "rows": [row dicts]}) are shown whole
on the gate's page (page.py). Judgement stays in the suite: a check measures (hashes, shapes, hits,
errors) and the view and its expectations decide, with thresholds from params.yaml like every
other gate.

The engine imports no check: checks need the domain (torch, the target, the drafter's export
rules) and sit above it (draftgate/checks/). A suite file cannot make a gate import code: it only
picks among the functions its stage passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from draftgate.gates.suite import GateError


@dataclass
class Computed:
    tables: dict[str, Any]                       # relation name -> pyarrow.Table, for the view
    report: dict[str, Any] = field(default_factory=dict)   # JSON-safe figures for the result file


# A check takes (inputs: name -> path, params_path) and returns Computed.
Check = Callable[[dict[str, str], str], Computed]


def run_check(name: str, checks: Mapping[str, Check], inputs: dict[str, str], params_path: str,
              where: str = "suite") -> tuple[Computed, float]:
    """Run the check `name` that the gate stage passed in `checks`; (what it computed, seconds)."""
    if name not in checks:
        given = ", ".join(sorted(checks)) or "none"
        raise GateError(f"{where}: \"compute\": {name!r} needs a check this command was not given (given: {given}); "
                        f"run the suite through its gate stage, `python -m stages.gate_{name}` (stages/gate_{name}.py), "
                        "or fix the suite's \"compute\"")
    start = time.perf_counter()
    computed = checks[name](inputs, params_path)
    clash = sorted(set(computed.tables) & set(inputs))
    if clash:
        raise GateError(f"check {name!r} computes {clash[0]!r}, which is also an input name; rename the input")
    return computed, time.perf_counter() - start
