"""draftgate validate end to end: real GX, real DuckDB, real files; each test reads as a sentence.

The parts have their own files: test_gates_{suite,table,custom,gx,docs,result}.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate_files import validate, write_json, write_parquet

ROOT = Path(__file__).resolve().parents[1]

TOKENS_SUITE = {
    "name": "tokens",
    "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "prompt_id"}},
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "prompt_id"}},
        {"type": "expect_column_values_to_be_in_set",
         "kwargs": {"column": "match", "value_set": ["exact", "bpe_only"]}},
        {"type": "expect_column_values_to_be_between",
         "kwargs": {"column": "n_completion", "min_value": 1, "max_value": 4096}},
        {"type": "expect_column_mean_to_be_between",
         "kwargs": {"column": "billing_delta", "min_value": -1, "max_value": 1}},
    ],
}


def tokens_rows(n: int = 6) -> dict:
    return {
        "prompt_id": [f"p{i}" for i in range(n)],
        "match": ["exact"] * (n - 1) + ["bpe_only"],
        "n_completion": [10 + i for i in range(n)],
        "billed_completion_tokens": [10 + i for i in range(n)],
        "billing_delta": [0] * n,
        "input_ids": [[1, 2, 3]] * n,      # a list column no check reads
        "messages": ['[{"role": "user", "content": "hi"}]'] * n,
    }


@pytest.fixture
def tokens(tmp_path):
    return write_parquet(tmp_path / "tokens.parquet", tokens_rows()), write_json(tmp_path / "tokens.json", TOKENS_SUITE)


# ------------------------------------------------------------ verdicts

def test_passing_suite_exits_0_writes_a_byte_stable_result_and_the_data_docs_index(tmp_path, tokens, capsys):
    data, suite = tokens
    result, docs = tmp_path / "gates" / "tokens.json", tmp_path / "docs"

    assert validate(suite, data, "--result", result, "--docs", docs) == 0
    first = result.read_bytes()
    assert validate(suite, data, "--result", result, "--docs", docs) == 0

    assert result.read_bytes() == first  # no timestamps: an unchanged artifact leaves the DVC dep unchanged
    r = json.loads(first)
    assert r["success"] is True and r["statistics"] == {
        "evaluated": 5, "successful": 5, "unsuccessful": 0, "success_percent": 100.0}
    assert r["artifact"]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert r["artifact"]["bytes"] == data.stat().st_size and r["rows"] == 6
    assert r["expectations"][4]["observed_value"] == 0.0
    assert "input_ids" not in r["columns_loaded"]
    index = (docs / "index.html").read_text()
    assert "tokens" in index
    assert "PASS 5/5" in capsys.readouterr().out


def test_corrupted_artifact_exits_1_and_prints_each_failure_with_its_observed_values(tmp_path, tokens, capsys):
    _, suite = tokens
    rows = tokens_rows()
    rows["prompt_id"][1] = None             # a null id
    rows["prompt_id"][3] = rows["prompt_id"][2]  # a duplicate id
    rows["n_completion"][4] = 99999         # out of range
    rows["billing_delta"] = [5] * 6         # mean 5, outside [-1, 1]
    bad = write_parquet(tmp_path / "bad.parquet", rows)
    result = tmp_path / "r.json"

    assert validate(suite, bad, "--result", result, "--no-docs") == 1

    out = capsys.readouterr().out
    fails = [line for line in out.splitlines() if "FAIL [" in line]
    assert len(fails) == 4
    assert "expect_column_values_to_not_be_null(column='prompt_id'): 1 of 6 rows unexpected" in fails[0]
    assert "expect_column_values_to_be_unique" in fails[1] and "'p2', 'p2'" in fails[1]
    assert "n_completion" in fails[2] and "99999" in fails[2]
    assert "expect_column_mean_to_be_between" in fails[3] and "observed 5.0" in fails[3]
    r = json.loads(result.read_text())
    assert r["success"] is False and r["statistics"]["unsuccessful"] == 4
    assert [e["success"] for e in r["expectations"]] == [False, False, True, False, False]
    assert r["expectations"][1]["unexpected_count"] == 2


def test_a_missing_column_fails_the_gate_naming_the_column(tmp_path, tokens, capsys):
    _, suite = tokens
    rows = tokens_rows()
    del rows["match"]
    data = write_parquet(tmp_path / "t.parquet", rows)

    assert validate(suite, data, "--no-docs") == 1
    line = [line for line in capsys.readouterr().out.splitlines() if "FAIL [" in line]
    assert line == ["  FAIL [2] expect_column_values_to_be_in_set(column='match', value_set=['exact', 'bpe_only']): "
                    "error: Error: The column \"match\" in BatchData does not exist."]


# ------------------------------------------------------------ no verdict: exit 2

def _suite_with(tmp_path, **changes) -> Path:
    return write_json(tmp_path / "s.json", {**TOKENS_SUITE, **changes})


@pytest.mark.parametrize("case, expected", [
    ("missing artifact", "does not exist"),
    ("garbage parquet", "unreadable as parquet"),
    ("suite not json", "not valid JSON"),
    ("unknown suite key", "unknown key 'tabel'; allowed keys: name, expectations"),
    ("unknown expectation type", "did you mean expect_column_values_to_be_unique"),
    ("bad kwargs", "expect_column_values_to_be_between: bad kwargs"),
    ("broken built-in", "always fails with pandas 3"),
    ("unknown parameter", "unknown $PARAMETER 'max_mismtach_rate'; params.yaml gates.tokens has: max_billing_delta_rate"),
    ("unsupported format", "unsupported format '.csv'"),
])
def test_unusable_input_exits_2_naming_the_problem_and_the_fix(tmp_path, tokens, capsys, monkeypatch, case, expected):
    data, suite = tokens
    if case == "missing artifact":
        data = tmp_path / "nope.parquet"
    elif case == "garbage parquet":
        data = tmp_path / "junk.parquet"
        data.write_bytes(b"not a parquet file at all")
    elif case == "suite not json":
        suite.write_text("{name: tokens")
    elif case == "unknown suite key":
        suite = _suite_with(tmp_path, tabel="checks")
    elif case == "unknown expectation type":
        suite = _suite_with(tmp_path, expectations=[{"type": "expect_column_values_to_be_uniqe",
                                                     "kwargs": {"column": "prompt_id"}}])
    elif case == "bad kwargs":
        suite = _suite_with(tmp_path, expectations=[{"type": "expect_column_values_to_be_between",
                                                     "kwargs": {"colum": "n_completion", "min_value": 1}}])
    elif case == "broken built-in":
        suite = _suite_with(tmp_path, expectations=[{"type": "expect_column_values_to_be_in_type_list",
                                                     "kwargs": {"column": "match", "type_list": ["str"]}}])
    elif case == "unknown parameter":
        suite = _suite_with(tmp_path, expectations=[{"type": "expect_column_max_to_be_between", "kwargs": {
            "column": "billing_delta", "max_value": {"$PARAMETER": "max_mismtach_rate"}}}])
        (tmp_path / "params.yaml").write_text("gates:\n  tokens:\n    max_mismatch_rate: 0.5\n")
    elif case == "unsupported format":
        data = tmp_path / "t.csv"
        data.write_text("a,b\n1,2\n")
    result = tmp_path / "r.json"
    monkeypatch.chdir(tmp_path)  # params.yaml is found relative to the working directory, as under dvc

    assert validate(suite, data, "--result", result, "--no-docs") == 2

    assert expected in capsys.readouterr().err
    r = json.loads(result.read_text())
    assert r["success"] is False and expected in r["error"]


def test_a_view_naming_an_input_not_given_exits_2_listing_the_inputs_given(tmp_path, tokens, capsys):
    data, _ = tokens
    suite = _suite_with(tmp_path, view="SELECT * FROM tokens JOIN rejects USING (prompt_id)")

    assert validate(suite, data, "--no-docs") == 2
    err = capsys.readouterr().err
    assert "rejects" in err and "inputs given: tokens" in err and "--input NAME=PATH" in err


# ------------------------------------------------------------ parameters

def test_parameters_resolve_from_gates_section_and_the_docs_show_the_resolved_value(tmp_path, tokens):
    data, _ = tokens
    suite = _suite_with(tmp_path, expectations=[{"type": "expect_column_value_fraction_between", "kwargs": {
        "column": "match", "value": ["bpe_only", "semantic", "unknown"],
        "max_value": {"$PARAMETER": "max_mismatch_rate"}}}])
    params, result, docs = tmp_path / "params.yaml", tmp_path / "r.json", tmp_path / "docs"

    params.write_text("gates:\n  tokens:\n    max_mismatch_rate: 0.125\n")   # 1 of 6 rows = 0.167
    assert validate(suite, data, "--params", params, "--result", result, "--docs", docs) == 1
    failed = json.loads(result.read_text())
    params.write_text("gates:\n  tokens:\n    max_mismatch_rate: 0.25\n")
    assert validate(suite, data, "--params", params, "--result", result, "--no-docs") == 0

    assert failed["expectations"][0]["kwargs"]["max_value"] == 0.125
    assert failed["expectations"][0]["observed_value"] == pytest.approx(1 / 6)
    assert failed["params"] == {"section": "gates.tokens", "values": {"max_mismatch_rate": 0.125}}
    pages = list((docs / "validations").rglob("*.html"))
    assert len(pages) == 1 and "0.125" in pages[0].read_text()


# ------------------------------------------------------------ one site, atomic result, no secrets

def test_every_gate_adds_its_validation_to_one_data_docs_site(tmp_path, tokens):
    data, suite = tokens
    prompts = write_parquet(tmp_path / "p.parquet", {"prompt_id": ["a"]})
    psuite = write_json(tmp_path / "prompts.json", {"name": "prompts", "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "prompt_id"}}]})
    docs = tmp_path / "docs"

    assert validate(suite, data, "--docs", docs) == 0
    assert validate(psuite, prompts, "--docs", docs) == 0

    index = (docs / "index.html").read_text()
    assert "tokens" in index and "prompts" in index
    assert {p.parts[-4] for p in (docs / "validations").rglob("*.html")} == {"tokens", "prompts"}


def test_the_default_site_is_reports_data_docs_under_the_working_directory(tmp_path, tokens, monkeypatch):
    data, suite = tokens
    monkeypatch.chdir(tmp_path)   # as under `dvc repro`, which runs from the repository root

    assert validate(suite, data, "--result", "gates/tokens.json") == 0

    assert (tmp_path / "reports" / "data_docs" / "index.html").is_file()
    assert json.loads((tmp_path / "gates" / "tokens.json").read_text())["docs"] == "reports/data_docs/index.html"


def test_a_failed_write_leaves_the_previous_result_whole_and_no_temp_file(tmp_path, tokens, monkeypatch):
    data, suite = tokens
    result = tmp_path / "out" / "r.json"
    result.parent.mkdir()
    result.write_text('{"previous": true}')

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        validate(suite, data, "--result", result, "--no-docs")

    assert result.read_text() == '{"previous": true}'
    assert [p.name for p in result.parent.iterdir()] == ["r.json"]


def test_neither_the_result_nor_the_docs_hold_an_environment_secret(tmp_path, tokens, monkeypatch):
    data, suite = tokens
    secret = "sk-or-" + "v1-0123456789abcdef-secret"   # built, so no scanner takes it for a real key
    monkeypatch.setenv("OPENROUTER_API_KEY", secret)
    result, docs = tmp_path / "r.json", tmp_path / "docs"

    assert validate(suite, data, "--result", result, "--docs", docs) == 0

    written = [result, *(p for p in docs.rglob("*") if p.is_file() and p.suffix in (".json", ".html"))]
    assert len(written) > 3
    assert not [p for p in written if secret in p.read_text(errors="replace")]


# ------------------------------------------------------------ the console script, a crash inside GX

def test_console_script_exits_1_on_failure_and_0_on_pass(tmp_path, tokens):
    data, suite = tokens
    strict = _suite_with(tmp_path, expectations=[{"type": "expect_table_row_count_to_be_between",
                                                  "kwargs": {"min_value": 7}}])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    done = subprocess.run([sys.executable, "-m", "draftgate", "validate", str(strict), str(data), "--no-docs"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert done.returncode == 1, done.stderr
    assert "FAIL [0] expect_table_row_count_to_be_between(min_value=7): observed 6" in done.stdout


def test_a_crash_inside_gx_is_no_verdict_exit_2_with_the_error_in_the_result(tmp_path, tokens, monkeypatch, capsys):
    from draftgate.gates import gx as gx_run

    data, suite = tokens

    def crash(*args, **kwargs):
        raise RuntimeError("metric store exploded")

    monkeypatch.setattr(gx_run, "validate", crash)
    result = tmp_path / "r.json"

    assert validate(suite, data, "--result", result, "--no-docs") == 2

    assert "RuntimeError: metric store exploded" in capsys.readouterr().err
    assert json.loads(result.read_text())["error"] == "internal error, please report: RuntimeError: metric store exploded"
