"""draftgate validate: real GX, real DuckDB, real files; each test reads as a sentence."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftgate.gates import validate as gates
from draftgate.gates.custom import roles_problem
from draftgate.gates.result import exception_messages, expectation_entry
from draftgate.gates.suite import ExpectationSpec
from draftgate.gates.table import Input
from draftgate.gates.validate import RESULT_FORMAT

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


def write_parquet(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def validate(*argv) -> int:
    return gates.main([str(a) for a in argv])


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


# ------------------------------------------------------------ parameters, views, JSON tables

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


def test_a_view_over_prompts_and_jsonl_rejects_gates_the_rejects_rate(tmp_path):
    prompts = write_parquet(tmp_path / "prompts.parquet", {"prompt_id": ["a", "b", "c"], "split": ["train"] * 3})
    rejects = tmp_path / "rejects.jsonl"
    rejects.write_text('{"source": "x.jsonl:4", "reason": "empty"}\n')
    view = ("SELECT p.*, (SELECT count(*) FROM rejects) / ((SELECT count(*) FROM prompts) + "
            "(SELECT count(*) FROM rejects)) AS rejects_rate FROM prompts p")
    suite = write_json(tmp_path / "prompts.json", {"name": "prompts", "view": view, "expectations": [
        {"type": "expect_column_max_to_be_between",
         "kwargs": {"column": "rejects_rate", "max_value": {"$PARAMETER": "max_rejects_rate"}}}]})
    params, result = tmp_path / "params.yaml", tmp_path / "r.json"

    params.write_text("gates:\n  prompts:\n    max_rejects_rate: 0.3\n")   # 1 of 4 = 0.25
    assert validate(suite, prompts, "--input", f"rejects={rejects}", "--params", params,
                    "--result", result, "--no-docs") == 0
    passed = json.loads(result.read_text())
    params.write_text("gates:\n  prompts:\n    max_rejects_rate: 0.2\n")
    assert validate(suite, prompts, "--input", f"rejects={rejects}", "--params", params, "--no-docs") == 1

    assert passed["expectations"][0]["observed_value"] == 0.25
    assert passed["artifact"]["rows"] == 3 and passed["inputs"][0]["name"] == "rejects"
    assert passed["inputs"][0]["rows"] == 1
    assert passed["inputs"][0]["sha256"] == hashlib.sha256(rejects.read_bytes()).hexdigest()


def test_json_table_key_validates_the_list_under_it_as_rows(tmp_path):
    contract = write_json(tmp_path / "contract.json", {"template": "chatml", "checks": [
        {"name": "<|im_start|>", "single_id": True, "round_trip": True},
        {"name": "<|im_end|>", "single_id": True, "round_trip": False}]})
    suite = write_json(tmp_path / "contract_suite.json", {"name": "contract", "table": "checks", "expectations": [
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 2}},
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "round_trip", "value_set": [True]}}]})
    result = tmp_path / "r.json"

    assert validate(suite, contract, "--result", result, "--no-docs") == 1

    r = json.loads(result.read_text())
    assert r["rows"] == 2 and r["table"] == "checks"
    assert [e["success"] for e in r["expectations"]] == [True, False]
    assert r["expectations"][1]["unexpected_sample"] == [False]


def test_json_document_without_the_table_key_exits_2_listing_its_keys(tmp_path, capsys):
    doc = write_json(tmp_path / "c.json", {"template": "chatml", "checks": []})
    suite = write_json(tmp_path / "s.json", {"name": "contract", "table": "rows", "expectations": [
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}}]})

    assert validate(suite, doc, "--no-docs") == 2
    assert "no key 'rows' (suite \"table\"); found: template, checks" in capsys.readouterr().err


def test_table_level_column_checks_see_every_column_name_while_only_read_columns_load(tmp_path, tokens):
    data, _ = tokens
    suite = _suite_with(tmp_path, expectations=[
        {"type": "expect_table_columns_to_match_set", "kwargs": {"column_set": list(tokens_rows())}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "prompt_id"}}])
    result = tmp_path / "r.json"

    assert validate(suite, data, "--result", result, "--no-docs") == 0
    assert json.loads(result.read_text())["columns_loaded"] == ["prompt_id"]


# ------------------------------------------------------------ custom expectations

def test_custom_expectations_pass_and_fail_at_their_bounds_and_render_sentences(tmp_path):
    data = write_parquet(tmp_path / "t.parquet", {
        "match": ["exact", "exact", "exact", "bpe_only"],
        "billing_delta": [1, -3, 0, 0],
        "billed": [100, 100, 100, 100],
        "messages": ['[{"role": "system", "content": ""}, {"role": "user", "content": "q"}]',
                     '[{"role": "user", "content": "q"}]',
                     '[{"role": "robot", "content": "q"}]',
                     'not json']})
    E = [
        ("expect_column_value_fraction_between", {"column": "match", "value": "exact", "min_value": 0.75}, True),
        ("expect_column_value_fraction_between", {"column": "match", "value": "exact", "min_value": 0.8}, False),
        ("expect_column_sum_ratio_between",
         {"column": "billing_delta", "denominator_column": "billed", "absolute": True, "max_value": 0.005}, True),
        ("expect_column_sum_ratio_between",
         {"column": "billing_delta", "denominator_column": "billed", "min_value": 0.0}, False),
        ("expect_column_values_json_roles_valid", {"column": "messages"}, False),
        ("expect_column_values_json_roles_valid", {"column": "messages", "mostly": 0.5}, True),
    ]
    suite = write_json(tmp_path / "s.json", {"name": "custom", "expectations": [
        {"type": t, "kwargs": kw} for t, kw, _ in E]})
    result, docs = tmp_path / "r.json", tmp_path / "docs"

    assert validate(suite, data, "--result", result, "--docs", docs) == 1

    r = json.loads(result.read_text())
    assert [e["success"] for e in r["expectations"]] == [ok for _, _, ok in E]
    assert r["expectations"][0]["observed_value"] == 0.75
    assert r["expectations"][2]["observed_value"] == pytest.approx(0.005)
    assert r["expectations"][3]["observed_value"] == pytest.approx(-0.005)
    assert r["expectations"][4]["unexpected_sample"] == ['[{"role": "robot", "content": "q"}]', "not json"]
    page = next((docs / "validations").rglob("*.html")).read_text()
    assert "fraction of rows where" in page and "over sum of" in page and "JSON lists of messages" in page


def test_custom_expectations_refuse_a_rule_without_bounds(tmp_path, capsys):
    data = write_parquet(tmp_path / "t.parquet", {"match": ["exact"]})
    suite = write_json(tmp_path / "s.json", {"name": "custom", "expectations": [
        {"type": "expect_column_value_fraction_between", "kwargs": {"column": "match", "value": "exact"}}]})

    assert validate(suite, data, "--no-docs") == 2
    assert "give min_value, max_value or both" in capsys.readouterr().err


@pytest.mark.parametrize("text, problem", [
    ('[{"role": "user", "content": "x"}]', None),
    ('[{"role": "user"}, {"role": "assistant"}]', "last message has role 'assistant'"),
    ('[{"role": "bot"}]', "message 0 has role 'bot'"),
    ("[]", "not a non-empty JSON list"),
    ("{", "not valid JSON"),
])
def test_roles_rule_names_what_is_wrong_with_a_messages_value(text, problem):
    assert roles_problem(text, ["system", "user", "assistant"], ["user"]) == problem


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


# ------------------------------------------------------------ the console script and the speed knobs

def test_console_script_exits_1_on_failure_and_0_on_pass(tmp_path, tokens):
    data, suite = tokens
    strict = _suite_with(tmp_path, expectations=[{"type": "expect_table_row_count_to_be_between",
                                                  "kwargs": {"min_value": 7}}])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    done = subprocess.run([sys.executable, "-m", "draftgate", "validate", str(strict), str(data), "--no-docs"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert done.returncode == 1, done.stderr
    assert "FAIL [0] expect_table_row_count_to_be_between(min_value=7): observed 6" in done.stdout


def test_gx_tuning_skips_only_work_that_cannot_change_a_result():
    import decimal

    import numpy as np

    from draftgate.gates import gx as gx_run

    gx_run.tune()
    import great_expectations.execution_engine.pandas_execution_engine as engine
    import great_expectations.util as gx_util

    assert engine.HASH_THRESHOLD == 0
    assert gx_run._gx_expectation.camel_to_snake("ExpectColumnValuesToBeUnique") == "expect_column_values_to_be_unique"
    assert gx_util.does_ndarray_contain_decimal_dtype(np.arange(5)) is False
    assert gx_util.does_ndarray_contain_decimal_dtype(np.array([decimal.Decimal("1.5")], dtype=object)) is True
    gx_run.tune()  # idempotent: a second gate in one process wraps nothing twice
    assert gx_util.does_ndarray_contain_decimal_dtype(np.array([1.0, decimal.Decimal("2")], dtype=object)) is True


# A suite that exercises every kind of GX result the gate reports: map checks failing with
# samples, passing ones, aggregates, custom expectations, a row count, a missing column.
EQUIVALENCE_SUITE = [
    ("expect_column_values_to_not_be_null", {"column": "prompt_id"}),
    ("expect_column_values_to_be_unique", {"column": "prompt_id"}),
    ("expect_column_values_to_be_in_set", {"column": "match", "value_set": ["exact", "bpe_only"]}),
    ("expect_column_values_to_be_in_set", {"column": "method", "value_set": ["truth", "text"], "mostly": 0.5}),
    ("expect_column_values_to_be_between", {"column": "n_completion", "min_value": 1, "max_value": 4096}),
    ("expect_column_mean_to_be_between", {"column": "billing_delta", "min_value": -1, "max_value": 1}),
    ("expect_column_values_to_be_null", {"column": "quarantine_reason"}),
    ("expect_column_value_fraction_between", {"column": "match", "value": "exact", "min_value": 0.5}),
    ("expect_column_sum_ratio_between", {"column": "billing_delta", "denominator_column": "billed_completion_tokens",
                                         "absolute": True, "max_value": 0.0004}),
    ("expect_table_row_count_to_be_between", {"min_value": 1}),
    ("expect_column_values_to_not_be_null", {"column": "no_such_column"}),
    # the other kinds the pipeline's suites (expectations/*.json) use
    ("expect_column_values_to_match_regex", {"column": "prompt_id", "regex": "^p[0-9]$"}),
    ("expect_column_values_to_not_be_in_set", {"column": "method", "value_set": ["logprobs"]}),
    ("expect_column_values_to_be_json_parseable", {"column": "messages"}),
    ("expect_column_values_json_roles_valid", {"column": "messages", "last_roles": ["user"]}),
    ("expect_column_max_to_be_between", {"column": "n_completion", "max_value": 100}),
    ("expect_column_min_to_be_between", {"column": "n_completion", "min_value": 0}),
    ("expect_column_pair_values_to_be_equal", {"column_A": "n_completion", "column_B": "n_billed"}),
    ("expect_table_columns_to_match_set", {"column_set": ["prompt_id", "match"], "exact_match": False}),
]


def equivalence_table(tmp_path) -> Path:
    n = 200
    return write_parquet(tmp_path / "t.parquet", {
        "prompt_id": [None if i == 7 else f"p{i % 190}" for i in range(n)],    # a null, 10 duplicated ids
        "match": ["exact"] * 150 + ["bpe_only"] * 40 + ["semantic"] * 10,
        "method": ["truth", "text", "logprobs", None] * (n // 4),
        "n_completion": [0 if i % 50 == 0 else 10 + i for i in range(n)],
        "billing_delta": [3 if i < 90 else 0 for i in range(n)],
        "billed_completion_tokens": [100] * n,
        "quarantine_reason": [None] * (n - 1) + ["empty_completion"],
        "messages": ['[{"role": "user", "content": "q"}]', '[{"role": "bot"}]', "{", None] * (n // 4),
        "n_billed": [0 if i % 50 == 0 else 10 + i + (i % 7 == 0) for i in range(n)],
    })


def by_config(validation) -> dict:
    """Each result keyed by its expectation (type + kwargs, without GX's batch_id)."""
    out = {}
    for r in validation.results:
        kwargs = {k: v for k, v in r.expectation_config.kwargs.items() if k != "batch_id"}
        out[(r.expectation_config.type, json.dumps(kwargs, sort_keys=True))] = r
    return out


def test_the_gates_validation_path_gives_gx_plain_paths_verdicts_and_observed_values(tmp_path):
    import great_expectations as gx

    from draftgate.gates import gx as gx_run
    from draftgate.gates import table as gate_table

    gx_run.tune()
    specs = [ExpectationSpec(t, kw) for t, kw in EQUIVALENCE_SUITE]
    frame = gate_table.load_table([Input("t", str(equivalence_table(tmp_path)))]).frame
    # GX's documented path: a registered suite, datasource and ValidationDefinition, run as is.
    context = gx.get_context(mode="ephemeral")
    suite = context.suites.add(gx.ExpectationSuite(name="plain", expectations=[gx_run.build_expectation(s) for s in specs]))
    batch = context.data_sources.add_pandas("p").add_dataframe_asset("t").add_batch_definition_whole_dataframe("w")
    definition = context.validation_definitions.add(gx.ValidationDefinition(name="plain", data=batch, suite=suite))
    plain = definition.run(batch_parameters={"dataframe": frame}, result_format=RESULT_FORMAT)

    fast = gx_run.validate(gx_run.make_context(None), "fast", [gx_run.build_expectation(s) for s in specs], frame,
                           asset="t", docs=False, result_format=RESULT_FORMAT).validation

    assert type(fast) is type(plain) and fast.success is plain.success is False
    assert fast.statistics == plain.statistics and plain.statistics["unsuccessful_expectations"] == 14
    plain_results, fast_results = by_config(plain), by_config(fast)
    assert plain_results.keys() == fast_results.keys() and len(plain_results) == len(specs)
    for key, p in plain_results.items():
        f = fast_results[key]
        assert (f.success, f.result) == (p.success, p.result), key
        assert exception_messages(f.exception_info) == exception_messages(p.exception_info), key
        spec = ExpectationSpec(key[0], json.loads(key[1]))
        assert expectation_entry(spec, f) == expectation_entry(spec, p), key
    unique = plain_results[("expect_column_values_to_be_unique", '{"column": "prompt_id"}')]
    assert unique.result["unexpected_count"] == 18 and unique.result["partial_unexpected_list"][:2] == ["p0", "p1"]


@pytest.mark.parametrize("kwargs", [
    {"batch_id": "p-t", "column": "x", "row_condition": None, "condition_parser": None, "table": None},
    {"value_set": ["a", "b", None], "mostly": 0.5, "strict": True, "n": 3},
    {"min_value": 1.5, "max_value": float("nan"), "column": "x"},       # NaN: GX's own path
    {"result_format": {"result_format": "BASIC", "partial_unexpected_count": 5}, "t": ("a", 1)},
    {"include_config": True, "catch_exceptions": False, "x": 10**20},
    {"only": "one key"},
    {},
])
def test_fast_metric_ids_are_gx_metric_ids(kwargs):
    from great_expectations.core.id_dict import IDDict

    from draftgate.gates import gx as gx_run

    plain = IDDict(kwargs).to_id()
    with gx_run.fast_internals():
        fast = IDDict(kwargs).to_id()
    assert fast == plain


def test_memoised_configurations_and_expectations_equal_gx_ones_and_the_patches_end_with_the_block():
    from great_expectations.core.id_dict import IDDict
    from great_expectations.expectations.expectation import Expectation
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    from draftgate.gates import gx as gx_run

    before = (Expectation.__dict__["configuration"], ExpectationConfiguration.__dict__["to_domain_obj"],
              IDDict.__dict__["to_id"])
    e = gx_run.build_expectation(ExpectationSpec("expect_column_values_to_be_in_set",
                                                       {"column": "m", "value_set": ["a", "b"]}, {"why": "x"}))
    plain_config = e.configuration
    plain_expectation = plain_config.to_domain_obj()
    with gx_run.fast_internals():
        config, config_again = e.configuration, e.configuration
        expectation, expectation_again = plain_config.to_domain_obj(), plain_config.to_domain_obj()
    assert config == plain_config and config_again is config
    assert expectation == plain_expectation and expectation_again is expectation
    assert e.configuration is not config and plain_config.to_domain_obj() is not expectation  # GX's own again
    assert (Expectation.__dict__["configuration"], ExpectationConfiguration.__dict__["to_domain_obj"],
            IDDict.__dict__["to_id"]) == before


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
