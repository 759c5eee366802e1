"""The custom expectations: their bounds, their rules, and the sentences the Data Docs show."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from draftgate.gates.custom import roles_problem
from gate_files import validate, write_json, write_parquet


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


@pytest.mark.parametrize("bounds, passes", [
    ({"max_value": 0.5}, True),
    ({"max_value": 0.5, "strict_max": True}, False),
    ({"min_value": 0.5, "strict_min": True}, False),
    ({"min_value": 0.25, "max_value": 0.75}, True),
])
def test_a_figure_on_a_bound_passes_unless_the_bound_is_strict(tmp_path, bounds, passes):
    data = write_parquet(tmp_path / "t.parquet", {"match": ["exact", "exact", "bpe_only", "bpe_only"],
                                                  "delta": [1, 1, 0, 0], "billed": [1, 1, 1, 1]})
    suite = write_json(tmp_path / "s.json", {"name": "custom", "expectations": [
        {"type": "expect_column_value_fraction_between", "kwargs": {"column": "match", "value": "exact", **bounds}},
        {"type": "expect_column_sum_ratio_between",
         "kwargs": {"column": "delta", "denominator_column": "billed", **bounds}}]})   # 2 / 4 = 0.5 too
    result = tmp_path / "r.json"

    assert validate(suite, data, "--result", result, "--no-docs") == (0 if passes else 1)
    assert [(e["success"], e["observed_value"]) for e in json.loads(result.read_text())["expectations"]] == \
        [(passes, 0.5)] * 2


def test_a_figure_over_an_empty_table_fails_with_no_observed_value(tmp_path):
    data = write_parquet(tmp_path / "t.parquet", {"match": pa.array([], pa.string()), "delta": pa.array([], pa.int64()),
                                                  "billed": pa.array([], pa.int64())})
    suite = write_json(tmp_path / "s.json", {"name": "custom", "expectations": [
        {"type": "expect_column_value_fraction_between", "kwargs": {"column": "match", "value": "exact",
                                                                    "min_value": 0.0}},
        {"type": "expect_column_sum_ratio_between",
         "kwargs": {"column": "delta", "denominator_column": "billed", "max_value": 1.0}}]})
    result = tmp_path / "r.json"

    assert validate(suite, data, "--result", result, "--no-docs") == 1
    assert [(e["success"], e["observed_value"]) for e in json.loads(result.read_text())["expectations"]] == \
        [(False, None)] * 2
