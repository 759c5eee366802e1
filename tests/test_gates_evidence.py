"""A failed check names its offending rows: keys and value, in the result file and on the Data Docs page."""

from __future__ import annotations

import datetime as dt
import json
import re

from draftgate.lineage import datadocs
from test_reconstruct_gate import edit, good_rows, names, qwen3_id, run_gate  # noqa: F401  (good_rows: a fixture)


def corrupted(tmp_path, tok, rows):
    """Two kept rows get a stray </think>: only the ids change, every flag reconstruct wrote stays."""
    def corrupt(t):
        for pid in ("p0", "p2"):
            t = edit(t, pid, completion=lambda c: c[:1] + [qwen3_id(tok, "</think>")] + c[1:])
        return t
    code, failed, _ = run_gate(tmp_path, tok, "qwen3", names(tok, "qwen3"), *rows, corrupt=corrupt)
    return code, failed, json.loads((tmp_path / "r.json").read_text())


def test_a_corrupted_tokens_table_names_each_offending_row_with_its_keys(tmp_path, qwen3_tok, good_rows):
    code, failed, result = corrupted(tmp_path, qwen3_tok, good_rows)

    assert code == 1 and "kept_think_unbalanced" in failed
    [check] = [e for e in result["expectations"] if e["kwargs"].get("column") == "kept_think_unbalanced"]
    assert check["offending_rows"] == [
        {"prompt_id": "p0", "dataset": "chat", "kept_think_unbalanced": "p0"},
        {"prompt_id": "p2", "dataset": "chat", "kept_think_unbalanced": "p2"}]
    # Passing checks pay no second pass and carry none.
    assert all("offending_rows" not in e for e in result["expectations"] if e["success"])


def test_the_page_rebuilt_from_that_record_shows_gxs_counts_and_the_rows_under_the_check(
        tmp_path, qwen3_tok, good_rows):
    _, _, result = corrupted(tmp_path, qwen3_tok, good_rows)
    record = tmp_path / "tokens.details.json"
    record.write_text(json.dumps(result))
    when = dt.datetime(2026, 12, 2, 1, 0, tzinfo=dt.timezone.utc)

    pages = datadocs.rebuild(tmp_path / "site", [datadocs.Record("gate_tokens", record, result, "workspace", when)])

    page = (tmp_path / "site" / pages["gate_tokens"]).read_text(encoding="utf-8")
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    # GX's own table of each unexpected value and its count, then the rows with their keys, in
    # the order the gate found them; the check's column, which repeats the prompt id, shown once.
    assert ("Unexpected Value Count p0 1 p2 1 What it checks: ") in text
    assert ("Offending rows (the first 2, with the evidence the suite computed): prompt_id dataset "
            "p0 chat p2 chat") in text
    # The suite's page, rebuilt from the record too, explains each check with the note it ran under.
    suite = " ".join(re.sub(r"<[^>]+>", " ", (tmp_path / "site" / "expectations" / "tokens.html").read_text()).split())
    [note] = [e["meta"]["notes"] for e in result["expectations"] if e["kwargs"].get("column") == "kept_think_unbalanced"]
    assert note.split(":")[0] in suite


def test_each_rule_finds_the_rows_gx_counted_with_their_keys(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate.gates.suite import Suite, ExpectationSpec
    from draftgate.gates.table import Input
    from draftgate.gates.validate import run_gate

    pq.write_table(pa.table({"prompt_id": ["a", "b", "c", "d"], "dataset": ["x", "x", "y", None],
                             "h": ["00ff", "zz", None, "12"], "n": [1, 5, 2, 9]}), tmp_path / "t.parquet")
    checks = (("expect_column_values_to_match_regex", {"column": "h", "regex": "^[0-9a-f]{4}$"}),
              ("expect_column_values_to_be_between", {"column": "n", "min_value": 0, "max_value": 4}),
              ("expect_column_values_to_be_in_set", {"column": "dataset", "value_set": ["x"]}))
    suite = Suite(name="t", path="t.json", sha256="", params_section="t",
                  expectations=tuple(ExpectationSpec(t, kw) for t, kw in checks))

    entries = run_gate(suite, [Input("t", str(tmp_path / "t.parquet"))]).result["expectations"]

    assert [e["unexpected_count"] for e in entries] == [2, 2, 1]
    assert [[r["prompt_id"] for r in e["offending_rows"]] for e in entries] == [["b", "d"], ["b", "d"], ["c"]]
    assert entries[1]["offending_rows"][0] == {"prompt_id": "b", "dataset": "x", "n": 5}
