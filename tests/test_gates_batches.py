"""A gate validates its table in batches and merges GX's results: the same result as one whole frame."""

from __future__ import annotations

import json

import pytest

from draftgate.gates import merge
from gate_files import validate, write_json, write_parquet

ROWS = {
    "prompt_id": ["a", "b", "c", "a", "d", None, "e", "c", "f", "g", "h"],
    "split": ["train", "heldout", "train", "train", "bogus", "train", "heldout", None, "train", "train", "train"],
    "n": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -11],
    "residual": [0, 1, 0, -1, 0, 2, 0, 0, 0, -3, 0],
    "billed": [10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10],
    "source": ["x:1", "x:2", "x:3", "x:4", "x5", "x:6", "x:7", "x:8", "x:9", "x:10", "x:11"],
}

EXPECTATIONS = [
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
    {"type": "expect_table_columns_to_match_set", "kwargs": {"column_set": list(ROWS), "exact_match": True}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "prompt_id"}},
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "prompt_id"}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "split", "value_set": ["train", "heldout"]}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "split", "value_set": ["train", "heldout"],
                                                             "mostly": 0.8}},
    {"type": "expect_column_values_to_be_null", "kwargs": {"column": "split"}},
    {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "source", "regex": "^.+:\\d+$"}},
    {"type": "expect_column_value_fraction_between",
     "kwargs": {"column": "split", "value": "heldout", "min_value": 0.1, "max_value": 0.3}},
    {"type": "expect_column_max_to_be_between", "kwargs": {"column": "n", "max_value": 10}},
    {"type": "expect_column_min_to_be_between", "kwargs": {"column": "n", "min_value": 0}},
    {"type": "expect_column_sum_ratio_between",
     "kwargs": {"column": "residual", "denominator_column": "billed", "absolute": True, "max_value": 0.05}},
    {"type": "expect_column_pair_values_to_be_equal", "kwargs": {"column_A": "residual", "column_B": "n"}},
]


def entries(path) -> list[dict]:
    return json.loads(path.read_text())["expectations"]


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5])
def test_a_table_validated_in_batches_gets_the_whole_tables_result_check_by_check(tmp_path, batch):
    data = write_parquet(tmp_path / "t.parquet", ROWS)
    suite = write_json(tmp_path / "s.json", {"name": "t", "expectations": EXPECTATIONS})
    whole, batched = tmp_path / "whole.json", tmp_path / "batched.json"

    assert validate(suite, data, "--result", whole, "--no-docs") == 1
    assert validate(suite, data, "--result", batched, "--no-docs", "--batch-rows", batch) == 1

    assert entries(batched) == entries(whole)
    assert json.loads(batched.read_text())["statistics"] == json.loads(whole.read_text())["statistics"]
    # the duplicates lie in different batches (rows 0 and 3, 2 and 7): found all the same
    unique = entries(whole)[3]
    assert (unique["unexpected_count"], unique["unexpected_sample"]) == (4, ["a", "c", "a", "c"])


def test_a_view_streams_out_of_duckdb_in_batches_with_the_same_result(tmp_path):
    data = write_parquet(tmp_path / "t.parquet", ROWS)
    suite = write_json(tmp_path / "s.json", {
        "name": "t", "view": "SELECT *, avg(CASE WHEN split = 'heldout' THEN 1.0 ELSE 0.0 END) OVER () AS rate FROM t",
        "expectations": EXPECTATIONS + [{"type": "expect_column_max_to_be_between",
                                         "kwargs": {"column": "rate", "max_value": 0.1}}]})
    whole, batched = tmp_path / "whole.json", tmp_path / "batched.json"

    assert validate(suite, data, "--result", whole, "--no-docs") == 1
    assert validate(suite, data, "--result", batched, "--no-docs", "--batch-rows", 4) == 1

    assert entries(batched) == entries(whole)
    assert entries(whole)[-1]["observed_value"] == pytest.approx(2 / 11)


def test_the_data_docs_hold_one_merged_result_per_run_not_one_per_batch(tmp_path):
    data = write_parquet(tmp_path / "t.parquet", ROWS)
    suite = write_json(tmp_path / "s.json", {"name": "t", "expectations": EXPECTATIONS})
    docs = tmp_path / "docs"

    assert validate(suite, data, "--docs", docs, "--batch-rows", 2) == 1

    stored = list((docs / ".gx" / "validations").rglob("*.json"))
    assert len(stored) == 1
    result = json.loads(stored[0].read_text())
    unique = next(r for r in result["results"] if r["expectation_config"]["type"].endswith("_unique"))
    assert unique["result"]["unexpected_count"] == 4
    assert result["statistics"]["evaluated_expectations"] == len(EXPECTATIONS)
    assert len(list((docs / "validations").rglob("*.html"))) == 1


def test_a_suite_with_a_check_that_cannot_merge_is_validated_whole(tmp_path):
    data = write_parquet(tmp_path / "t.parquet", {"n": [3, 1, 2, 4]})
    suite = write_json(tmp_path / "s.json", {"name": "t", "expectations": [
        {"type": "expect_column_median_to_be_between", "kwargs": {"column": "n", "min_value": 2.5, "max_value": 2.5}}]})
    result = tmp_path / "r.json"

    assert validate(suite, data, "--result", result, "--no-docs", "--batch-rows", 1) == 0
    assert entries(result)[0]["observed_value"] == 2.5


def test_merge_rules_follow_gx_on_empty_batches_and_mostly():
    empty = {"element_count": 0, "unexpected_count": 0, "unexpected_percent": None, "partial_unexpected_list": [],
             "missing_count": 0, "missing_percent": None, "unexpected_percent_total": None,
             "unexpected_percent_nonmissing": None}
    ok, result = merge.merge("expect_column_values_to_be_in_set", {"column": "x"}, [empty, empty], [True, True],
                             [0, 0], 5)
    assert ok and result == empty
    some = {**empty, "element_count": 10, "unexpected_count": 1, "missing_count": 0}
    assert merge.merge("expect_column_values_to_be_in_set", {"mostly": 0.95}, [some, some], [False, False],
                       [10, 10], 5)[0] is False
    assert merge.merge("expect_column_values_to_be_in_set", {"mostly": 0.9}, [some, some], [True, True],
                       [10, 10], 5)[0] is True
    assert merge.between(None, {"max_value": 1}) is False
    assert merge.between(1.0, {"max_value": 1, "strict_max": True}) is False
