"""Reading a gate's result file: the stage after a gate refuses to run unless it passed.

DVC already orders the stages (the result file is a dep); this check also stops a stage run by
hand, or by `dvc repro --single-item`, on data its gate rejected.
"""

from __future__ import annotations

import json
from pathlib import Path


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
