"""The validated table: views over named inputs, JSON documents as tables, only the columns read."""

from __future__ import annotations

import hashlib
import json


from gate_files import validate, write_json, write_parquet

ROWS = [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}}]


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


def test_table_level_column_checks_see_every_column_name_while_only_read_columns_load(tmp_path):
    columns = {"prompt_id": ["a", "b"], "input_ids": [[1, 2], [3]], "match": ["exact", "exact"]}
    data = write_parquet(tmp_path / "t.parquet", columns)
    suite = write_json(tmp_path / "s.json", {"name": "tokens", "expectations": [
        {"type": "expect_table_columns_to_match_set", "kwargs": {"column_set": list(columns)}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "prompt_id"}}]})
    result = tmp_path / "r.json"

    assert validate(suite, data, "--result", result, "--no-docs") == 0
    assert json.loads(result.read_text())["columns_loaded"] == ["prompt_id"]


def test_a_gate_that_stops_on_a_bad_view_or_check_leaves_no_spill_directory(tmp_path, monkeypatch, capsys):
    import tempfile

    spill = tmp_path / "tmp"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))
    prompts = write_parquet(tmp_path / "prompts.parquet", {"prompt_id": ["a"], "split": ["train"]})
    bad_view = write_json(tmp_path / "v.json", {"name": "prompts", "view": "SELECT * FROM missing",
                                                "expectations": ROWS})
    bad_check = write_json(tmp_path / "c.json", {"name": "prompts", "view": "SELECT * FROM prompts",
                                                 "expectations": [{"type": "expect_no_such_thing", "kwargs": {}}]})
    assert validate(bad_view, prompts, "--no-docs") == 2
    assert "view does not run" in capsys.readouterr().err
    assert validate(bad_check, prompts, "--no-docs") == 2
    assert list(spill.iterdir()) == []


def test_relations_are_created_in_order_and_a_materialized_one_is_computed_once(tmp_path):
    prompts = write_parquet(tmp_path / "prompts.parquet", {"prompt_id": ["a", "b", "c"], "n": [1, 2, 6]})
    suite = write_json(tmp_path / "s.json", {
        "name": "prompts",
        "relations": [{"name": "doubled", "sql": "SELECT prompt_id, 2 * n AS m FROM prompts"},
                      {"name": "total", "sql": ["SELECT sum(m) AS s", "FROM doubled"], "materialize": True}],
        "view": "SELECT d.prompt_id, d.m / t.s AS share FROM doubled AS d CROSS JOIN total AS t",
        "expectations": [{"type": "expect_column_sum_to_be_between",
                          "kwargs": {"column": "share", "min_value": 0.999, "max_value": 1.001}},
                         {"type": "expect_column_max_to_be_between",
                          "kwargs": {"column": "share", "min_value": 0.66, "max_value": 0.67}}]})
    result = tmp_path / "r.json"
    assert validate(suite, prompts, "--result", result, "--no-docs") == 0
    assert json.loads(result.read_text())["rows"] == 3


def test_a_relation_that_does_not_run_or_is_malformed_stops_the_gate_naming_it(tmp_path, capsys):
    prompts = write_parquet(tmp_path / "prompts.parquet", {"prompt_id": ["a"]})
    broken = write_json(tmp_path / "b.json", {"name": "prompts", "view": "SELECT * FROM agg",
                                              "relations": [{"name": "agg", "sql": "SELECT nope FROM prompts",
                                                             "materialize": True}],
                                              "expectations": ROWS})
    assert validate(broken, prompts, "--no-docs") == 2
    assert "relation 'agg' does not run" in capsys.readouterr().err
    for bad, says in (([{"name": "1x", "sql": "SELECT 1"}], "needs a \"name\""),
                      ([{"name": "x", "sql": "SELECT 1", "materialise": True}], "unknown key 'materialise'"),
                      ({"x": "SELECT 1"}, "must be a list")):
        suite = write_json(tmp_path / "m.json", {"name": "prompts", "view": "SELECT 1 AS one", "relations": bad,
                                                 "expectations": ROWS})
        assert validate(suite, prompts, "--no-docs") == 2
        assert says in capsys.readouterr().err
