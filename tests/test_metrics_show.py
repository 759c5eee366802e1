"""`dvc metrics show` reads at a glance: every metric that dvc.yaml declares, made by the stages' own
rule (draftgate/metrics.py `metric`, a gate's draftgate/gates/result.py `metric`) from the details
the last `dvc repro` committed beside it (the details hold everything), and printed by DVC itself.

DVC prints one table: a row per metric file and a column per key of any of them. Before the
breakdowns moved to the details it was 500 columns, 13,400 characters a line (eval's alone: 212).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftgate.evaluate.measure import DETAILS_ONLY as EVAL_DETAILS_ONLY
from draftgate.gates.result import metric as gate_metric
from draftgate.metrics import BREAKDOWNS, details_path, metric
from draftgate.repair.run import DETAILS_ONLY as REPAIR_DETAILS_ONLY
from stages import reconstruct as reconstruct_stage

REPO = Path(__file__).resolve().parents[1]
DVC = str(Path(sys.executable).parent / "dvc")
# What each metric file's stage keeps in its details beyond the common rule.
DETAILS_ONLY = {"metrics/eval.json": EVAL_DETAILS_ONLY,
                "metrics/mismatch.json": reconstruct_stage.MISMATCH_DETAILS_ONLY,
                "metrics/repair.json": REPAIR_DETAILS_ONLY}
MAX_COLUMNS = 180          # the whole table; 176 with this pipeline's metrics (218 while the gates showed their figures)
TERMINAL = 280             # one line of the eval figures, or of the ten gates' verdicts


def declared_metrics() -> list[tuple[str, bool]]:
    """(metric path, written by a gate) for every metric of dvc.yaml, in its order."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    return [(next(iter(m)) if isinstance(m, dict) else m, name.startswith("gate_"))
            for name, st in stages.items() for m in st.get("metrics", [])]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A DVC project holding each declared metric as its stage writes it now."""
    work = tmp_path_factory.mktemp("metrics_show")
    for path, by_gate in declared_metrics():
        full = json.loads((REPO / details_path(path)).read_text())
        data = gate_metric(full) if by_gate else metric(full, DETAILS_ONLY.get(path, ()))
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(json.dumps(data))
    subprocess.run([DVC, "init", "--no-scm", "-q"], cwd=work, check=True)
    (work / "dvc.yaml").write_text(yaml.safe_dump({"metrics": [p for p, _ in declared_metrics()]}))
    return work


def dvc_metrics_show(project: Path, *targets: str) -> list[str]:
    out = subprocess.run([DVC, "metrics", "show", *targets], cwd=project, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_the_whole_table_has_a_bounded_number_of_columns_and_no_breakdown(project):
    header = dvc_metrics_show(project)[0].split()[1:]
    assert len(header) <= MAX_COLUMNS, f"{len(header)} columns: move breakdowns to the details (draftgate/metrics.py)"
    assert not [c for c in header if any(BREAKDOWNS.match(part) for part in c.split("."))]


def test_the_eval_line_shows_each_proposers_acceptance_length_with_its_interval_in_a_terminals_width(project):
    lines = dvc_metrics_show(project, "metrics/eval.json")
    figures = {c for c in lines[0].split()[1:] if c not in ("rows_in", "rows_out", "dropped")}
    assert figures == {f"{p}.{f}" for p in ("drafter", "ngram", "ngram.best")
                       for f in ("acceptance_length", "ci95.low", "ci95.high")}
    assert max(map(len, lines)) <= TERMINAL


def test_every_gate_shows_its_verdict_in_the_same_four_columns_and_all_ten_fit_a_terminal(project):
    gates = [p for p, by_gate in declared_metrics() if by_gate]
    lines = dvc_metrics_show(project, *gates)
    assert len(lines) == 1 + len(gates)
    assert lines[0].split()[1:] == ["checks", "failed", "rows", "success"]    # every committed gate passes
    assert max(map(len, lines)) <= TERMINAL
