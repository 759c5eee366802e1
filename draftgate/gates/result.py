"""A gate's two files: the full result for review, and the metric DVC shows and the next stage reads.

The result (`--result`, data/gates/<suite>.details.json) holds everything the gate saw: each check
with its kwargs, meta, observed value and a sample of unexpected values, the suite's view, the
inputs' fingerprints. The metric (`--metric`, data/gates/<suite>.json) holds numbers only, so
`dvc metrics show` stays a readable table: the verdict, how many checks ran and failed, the rows
validated, each aggregate check's observed figure and each failing map check's unexpected count.

The stage after a gate refuses to run unless the gate passed (require_passed, on the metric). DVC
already orders the stages (the metric is a dep); this check also stops a stage run by hand, or by
`dvc repro --single-item`, on data its gate rejected.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

SAMPLE = 5          # unexpected values kept per expectation in the result file
SHORT = 200         # characters kept of any one value


def short(value: Any) -> Any:
    """JSON-safe, bounded copy of an observed value (no NaN: DVC reads these files)."""
    if isinstance(value, float):  # np.float64 too: it subclasses float
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value) <= SHORT else value[:SHORT] + f"... ({len(value)} chars)"
    if isinstance(value, (list, tuple)):
        return [short(v) for v in value[:SAMPLE]] + ([f"... ({len(value)} items)"] if len(value) > SAMPLE else [])
    if isinstance(value, dict):
        return {str(k): short(v) for k, v in list(value.items())[:20]}
    if value is None or isinstance(value, (bool, int)):
        return value
    if hasattr(value, "item"):  # numpy scalar
        return short(value.item())
    return short(str(value))


def expectation_entry(spec: Any, outcome: Any) -> dict:
    """`spec`: a suite.ExpectationSpec (not imported: stages that only read gate results must not
    depend on the suite parser)."""
    res = outcome.result or {}
    entry = {"type": spec.type, "kwargs": spec.kwargs, "success": bool(outcome.success)}
    if "observed_value" in res:
        entry["observed_value"] = short(res["observed_value"])
    if "unexpected_count" in res:
        entry["element_count"] = res.get("element_count")
        entry["unexpected_count"] = res["unexpected_count"]
        entry["unexpected_percent"] = short(res.get("unexpected_percent"))
        entry["unexpected_sample"] = short(list(res.get("partial_unexpected_list") or [])[:SAMPLE])
    errors = exception_messages(outcome.exception_info)
    if errors:
        entry["exception"] = "; ".join(errors)
    if spec.meta:
        entry["meta"] = spec.meta
    return entry


def exception_messages(info: Any) -> list[str]:
    """GX reports an error either flat or keyed by the metric that raised it (a missing column)."""
    if not isinstance(info, dict):
        return []
    found = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    messages = [" ".join(str(f.get("exception_message", "")).split()) for f in found if f.get("raised_exception")]
    return list(dict.fromkeys(m for m in messages if m))


def failure_line(i: int, e: dict) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in e["kwargs"].items())
    if e.get("exception"):
        what = f"error: {e['exception']}"
    elif "unexpected_count" in e and e.get("observed_value") is None:
        sample = ", ".join(repr(v) for v in e["unexpected_sample"])
        what = (f"{e['unexpected_count']} of {e['element_count']} rows unexpected "
                f"({(e['unexpected_percent'] or 0):.3g}%), e.g. {sample}")
    else:
        what = f"observed {e.get('observed_value')!r}"
    return f"  FAIL [{i}] {e['type']}({args}): {what}"


# ------------------------------------------------------------ the metric

def metric(result: dict) -> dict:
    """The verdict of a result: what `dvc metrics show` prints for the gate (no text, no lists).

        {"success": false, "checks": 22, "failed": 1, "rows": 118,
         "unexpected": {"special_id_in_text": {"to_be_null": 3}}}

    Every gate shows the same four columns, plus a count per failing check while one fails. The
    observed figures stay in the details (`figures`): 45 of them across the ten gates made the
    table 8,500 characters wide, and each repeats a figure its stage's own metric shows.
    """
    if "statistics" not in result:     # no verdict: a missing input, a bad suite
        return {"success": False, "no_verdict": True}
    stats = result["statistics"]
    return {"success": bool(result["success"]), "checks": stats["evaluated"], "failed": stats["unsuccessful"],
            "rows": result["rows"], "unexpected": _tally(result)[1]}


def figures(result: dict) -> dict:
    """Each aggregate check's observed figure, by subject: {"quarantine_rate": {"max": 0.0}, ...}."""
    return _tally(result)[0] if "statistics" in result else {}


def _tally(result: dict) -> tuple[dict, dict]:
    observed: dict[str, dict] = {}
    unexpected: dict[str, dict] = {}
    for e in result["expectations"]:
        subject = _subject(e["kwargs"])
        value = e.get("observed_value")
        if _number(value):
            _put(observed, subject, _figure(e["type"]), value)
        elif e.get("unexpected_count"):
            _put(unexpected, subject, _check(e["type"]), e["unexpected_count"])
    return observed, unexpected


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not (isinstance(value, float) and not math.isfinite(value))


def _subject(kwargs: dict) -> str:
    if isinstance(kwargs.get("column"), str):
        return kwargs["column"]
    pair = [kwargs.get(k) for k in ("column_A", "column_B")]
    return "_".join(pair) if all(isinstance(c, str) for c in pair) else "table"


def _figure(type_: str) -> str:
    """expect_column_max_to_be_between -> max; expect_table_row_count_to_be_between -> row_count."""
    name = re.sub(r"^expect_(?:column_|table_)?", "", type_)
    return re.sub(r"_(?:to_(?:be|equal|match)\w*|between)$", "", name) or name


def _check(type_: str) -> str:
    """expect_column_values_to_be_null -> to_be_null; ..._json_roles_valid -> json_roles_valid."""
    return re.sub(r"^expect_(?:column_(?:pair_)?values_|table_)?", "", type_)


def _put(into: dict, subject: str, name: str, value: Any) -> None:
    figures = into.setdefault(subject, {})
    key, n = name, 1
    while key in figures:     # the same figure twice on one column (two fractions of different values)
        n += 1
        key = f"{name}_{n}"
    figures[key] = value


# ------------------------------------------------------------ the next stage

class GateNotPassed(ValueError):
    """The gate's metric is missing, unreadable, or says the suite failed."""


def require_passed(path: str | Path, gate: str, then: str) -> None:
    """Raise unless `path` (the metric written by `draftgate validate --metric`) records success.

    `gate` names the gate stage (e.g. gate_prompts); `then` says what to fix before rerunning.
    """
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GateNotPassed(f"{path}: gate result not found; run `dvc repro` ({gate}) first") from None
    except ValueError as e:
        raise GateNotPassed(f"{path}: not JSON ({e}); rerun `dvc repro` ({gate})") from None
    success = result.get("success") if isinstance(result, dict) else None
    if success is not True:
        counts = (f", {result['failed']} of {result['checks']} checks failed"
                  if isinstance(result, dict) and {"failed", "checks"} <= result.keys() else "")
        raise GateNotPassed(f"{path}: {gate} did not pass (success: {success!r}{counts}); {then} "
                            "(the gate's result file and the Data Docs list every failed check)")
