"""A gate's result: each GX outcome as a bounded JSON entry; the file the next stage reads.

The stage after a gate refuses to run unless the gate passed (require_passed). DVC already orders
the stages (the result file is a dep); this check also stops a stage run by hand, or by
`dvc repro --single-item`, on data its gate rejected.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from draftgate.gates.suite import ExpectationSpec

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


def expectation_entry(spec: ExpectationSpec, outcome: Any) -> dict:
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


# ------------------------------------------------------------ the next stage

class GateNotPassed(ValueError):
    """The gate's result file is missing, unreadable, or says the suite failed."""


def require_passed(path: str | Path, gate: str, then: str) -> None:
    """Raise unless `path` (written by `draftgate validate`) records success.

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
        raise GateNotPassed(f"{path}: {gate} did not pass (success: {success!r}); {then} "
                            "(the gate's result file and the Data Docs list every failed check)")
