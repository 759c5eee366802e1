"""A gate's files: the metric (numbers, what DVC shows and the next stage reads) and the full result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftgate.gates import validate as gates
from draftgate.gates.result import GateNotPassed, figures, metric, require_passed

VENV_BIN = Path(sys.executable).parent

# A view (SQL text), meta, a $PARAMETER, a failing map check, aggregates passing and failing.
SUITE = {"name": "tokens", "view": ["SELECT t.*, t.n / 10 AS rate", "FROM tokens AS t"], "expectations": [
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1},
     "meta": {"why": "an empty table would pass every other check vacuously"}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "match", "value_set": ["exact"]}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "prompt_id"}},
    {"type": "expect_column_max_to_be_between", "kwargs": {"column": "rate", "max_value": {"$PARAMETER": "max_mismatch_rate"}}},
    {"type": "expect_column_value_fraction_between", "kwargs": {"column": "match", "value": "exact", "min_value": 0.5}},
    {"type": "expect_column_value_fraction_between", "kwargs": {"column": "match", "value": "bpe_only",
                                                                "max_value": 0.5}}]}


@pytest.fixture
def gated(tmp_path):
    """Run the suite once: (exit code, metric path, result path)."""
    pq.write_table(pa.table({"prompt_id": ["a", "b", "c", "d"], "match": ["exact", "exact", "exact", "bpe_only"],
                             "n": [1, 2, 3, 4]}), tmp_path / "tokens.parquet")
    (tmp_path / "tokens.json").write_text(json.dumps(SUITE))
    (tmp_path / "params.yaml").write_text("gates:\n  tokens:\n    max_mismatch_rate: 0.3\n")
    m, r = tmp_path / "gates" / "tokens.json", tmp_path / "gates" / "tokens.details.json"
    code = gates.main([str(tmp_path / "tokens.json"), str(tmp_path / "tokens.parquet"), "--metric", str(m),
                       "--result", str(r), "--params", str(tmp_path / "params.yaml"), "--no-docs"])
    return code, m, r


def leaves(value, path=""):
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in leaves(v, f"{path}.{k}".lstrip("."))]
    return [(path, value)]


# ------------------------------------------------------------ the metric

def test_the_metric_holds_the_verdict_and_the_failing_checks_counts_as_numbers_only(gated):
    code, m, _ = gated
    assert code == 1

    doc = json.loads(m.read_text())
    assert doc == {"success": False, "checks": 6, "failed": 2, "rows": 4,
                   "unexpected": {"match": {"to_be_in_set": 1}}}
    assert [(p, v) for p, v in leaves(doc) if isinstance(v, str) or not isinstance(v, (int, float))] == []


def test_the_observed_figures_are_read_from_the_result_beside_it(gated):
    _, _, r = gated
    assert figures(json.loads(r.read_text())) == {"table": {"row_count": 4}, "rate": {"max": 0.4},
                                                  "match": {"value_fraction": 0.75, "value_fraction_2": 0.25}}


def test_the_result_beside_it_keeps_every_word_the_metric_leaves_out(gated):
    _, m, r = gated
    doc = json.loads(r.read_text())

    assert doc["view"] == "SELECT t.*, t.n / 10 AS rate\nFROM tokens AS t"
    assert doc["expectations"][0]["meta"] == {"why": "an empty table would pass every other check vacuously"}
    assert doc["expectations"][1]["kwargs"] == {"column": "match", "value_set": ["exact"]}
    assert doc["expectations"][1]["unexpected_sample"] == ["bpe_only"]
    assert doc["params"] == {"section": "gates.tokens", "values": {"max_mismatch_rate": 0.3}}
    assert metric(doc) == json.loads(m.read_text())


def test_both_files_are_byte_stable_on_the_same_data(gated, tmp_path):
    _, m, r = gated
    first = m.read_bytes(), r.read_bytes()
    gates.main([str(tmp_path / "tokens.json"), str(tmp_path / "tokens.parquet"), "--metric", str(m), "--result", str(r),
                "--params", str(tmp_path / "params.yaml"), "--no-docs"])
    assert (m.read_bytes(), r.read_bytes()) == first


def test_no_verdict_writes_a_failed_metric_and_the_error_in_the_result(tmp_path):
    m, r = tmp_path / "m.json", tmp_path / "r.json"
    assert gates.main(["nosuch", str(tmp_path / "t.parquet"), "--metric", str(m), "--result", str(r),
                       "--suites", str(tmp_path), "--no-docs"]) == 2
    assert json.loads(m.read_text()) == {"success": False, "no_verdict": True}
    assert "neither a file nor a suite name" in json.loads(r.read_text())["error"]


def test_dvc_metrics_show_prints_a_narrow_table_of_figures(gated, tmp_path):
    from draftgate.metrics import StageMetrics

    stage = StageMetrics("generate", rows_in=3, rows_out=2, params={"model": "m", "base_url": "https://x/v1"},
                         figures={"finish_reasons": {"stop": 2}, "stop_reason": None, "spent_usd": 0.5,
                                  "examples": {"empty": "a long quarantined answer " * 20}})
    stage.drop("empty")
    stage.write(tmp_path / "metrics" / "generate.json")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  gate_tokens:\n    cmd: 'true'\n    metrics:\n"
        "      - gates/tokens.json:\n          cache: false\n      - metrics/generate.json:\n          cache: false\n")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, env=env, check=True, capture_output=True)

    shown = subprocess.run(["dvc", "metrics", "show"], cwd=tmp_path, env=env, check=True, capture_output=True,
                           text=True).stdout

    header, *rows = shown.strip().splitlines()
    assert len(header.split()) == 12 and len(rows) == 2      # Path + 11 figures over both files
    assert max(len(cell) for row in rows for cell in row.split()[1:]) <= 5    # numbers, "-" where absent
    assert "drops_by_reason.empty" in header and "failed" in header and "unexpected.match.to_be_in_set" in header
    assert "observed" not in header                           # the gate's figures are in its result file
    assert not any(text in shown for text in ("SELECT", "why", "https://", "quarantined", "generate  "))


# ------------------------------------------------------------ the next stage

def test_a_passed_gate_lets_the_next_stage_run(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"success": True}))
    require_passed(path, "gate_x", "fix x")


def test_the_metric_a_failed_gate_wrote_stops_the_next_stage_naming_the_count(gated):
    _, m, _ = gated
    with pytest.raises(GateNotPassed, match=r"gate_tokens did not pass \(success: False, 2 of 6 checks failed\)"):
        require_passed(m, "gate_tokens", "fix the tokens")


@pytest.mark.parametrize("content, message", [
    (None, "gate result not found; run `dvc repro` (gate_x) first"),
    ("{not json", "not JSON"),
    (json.dumps({"success": False}), "gate_x did not pass (success: False); fix x"),
    (json.dumps({"success": False, "no_verdict": True}), "gate_x did not pass (success: False); fix x"),
    (json.dumps({"success": "yes"}), "did not pass (success: 'yes')"),
    (json.dumps([True]), "did not pass (success: None)"),
])
def test_a_missing_unreadable_or_failed_gate_stops_the_next_stage_saying_why(tmp_path, content, message):
    path = tmp_path / "g.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(GateNotPassed) as e:
        require_passed(path, "gate_x", "fix x")
    assert message in str(e.value) and str(path) in str(e.value)
