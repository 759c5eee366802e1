"""expectations/responses.json on a real generate run (scripted server), through `draftgate validate`.

The gate is a second opinion: each check is tested by corrupting the data (content, provider, rows)
while the client's own columns (`status`, `failure_reason`) still say all is well.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from draftgate import schema
from draftgate.gates import validate as gates
from draftgate.client.response import junk_reason
from draftgate.serve.scripted import Script, running
from stages import generate

REPO = Path(__file__).resolve().parents[1]
SUITE = str(REPO / "expectations" / "responses.json")
LONG = ('{"id":"g","provider":"Prov","model":"m","choices":[{"finish_reason":"length",'
        '"message":{"content":"cut"}}],"usage":{"prompt_tokens":2,"completion_tokens":64}}')


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("gate")
    rows = [{"prompt_id": f"id{i:04d}", "dataset": "tiny", "split": "train", "source": f"tiny.jsonl:{i + 1}",
             "messages": json.dumps([{"role": "user", "content": f"p{i:04d}"}]), "tools": None,
             "n_duplicates": 0} for i in range(20)]
    (tmp / "prompts").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.prompts()), tmp / "prompts" / "prompts.parquet")
    (tmp / "gate.json").write_text('{"success": true}')
    # p0003 answers a leaked error every time: the client quarantines it as a failed row.
    script = Script(replies={"p0001": LONG}, per_key={"p0002": ("http_400",), "p0003": ("leaked_error_body",) * 2},
                    cost_usd=0.01)
    with running(script) as server:
        gp = {"backend": "openai", "model": "m", "base_url": server.base_url, "retry_base_s": 0.005,
              "max_attempts": 2}
        (tmp / "params.yaml").write_text(yaml.safe_dump({"generate": gp}))
        assert generate.main(["--params", str(tmp / "params.yaml"), "--prompts", str(tmp / "prompts" / "prompts.parquet"),
                              "--gate", str(tmp / "gate.json"), "--out", str(tmp / "responses"),
                              "--metrics", str(tmp / "metrics.json")]) == 0
    return tmp


def validate(run_dir: Path, responses: Path, **gate_params) -> tuple[int, dict]:
    params = yaml.safe_load((run_dir / "params.yaml").read_text())
    params["gates"] = {"responses": {"max_failed_rate": 0.15, "max_length_rate": 0.1,
                                     "ignore_providers": ["Fireworks"], "max_cost_usd": 1.0, **gate_params}}
    (run_dir / "gate_params.yaml").write_text(yaml.safe_dump(params))
    result = run_dir / "result.json"
    code = gates.main([SUITE, str(responses), "--input", f"prompts={run_dir / 'prompts' / 'prompts.parquet'}",
                       "--result", str(result), "--params", str(run_dir / "gate_params.yaml"), "--no-docs"])
    return code, json.loads(result.read_text())


def failed_columns(result: dict) -> set[str]:
    return {e["kwargs"].get("column") for e in result["expectations"] if not e["success"]}


def healthy(run_dir: Path) -> pa.Table:
    return pq.read_table(run_dir / "responses" / "responses.parquet")


def with_column(table: pa.Table, name: str, values: dict[str, str]) -> pa.Table:
    """`table` with column `name` set to values[prompt_id] on those rows; nothing else changes."""
    column = [values.get(pid, v) for pid, v in zip(table["prompt_id"].to_pylist(), table[name].to_pylist())]
    return table.set_column(table.schema.get_field_index(name), name, pa.array(column, pa.string()))


def write(run_dir: Path, table: pa.Table, name: str = "bad.parquet") -> Path:
    pq.write_table(table, run_dir / name)
    return run_dir / name


def failure(result: dict, column: str) -> dict:
    return next(e for e in result["expectations"] if e["kwargs"].get("column") == column)


def test_a_healthy_run_passes_the_responses_gate(run_dir):
    code, result = validate(run_dir, run_dir / "responses" / "responses.parquet")
    assert (code, result["success"], result["rows"]) == (0, True, 20)


def test_a_junk_answer_the_client_quarantined_is_a_failed_row_and_passes_the_gate(run_dir):
    row = next(r for r in healthy(run_dir).to_pylist() if r["prompt_id"] == "id0003")
    assert (row["status"], row["failure_reason"], row["attempts"]) == ("failed", "leaked_error_body", 2)
    assert junk_reason(row["content"]) == "leaked_error_body" and row["provider"] == "Scripted"
    assert row["cost_usd"] == row["wasted_cost_usd"] == pytest.approx(0.02)   # both junk answers were billed


def test_the_gate_fails_on_truncations_failures_excluded_providers_cost_and_duplicates(run_dir):
    table = pq.read_table(run_dir / "responses" / "responses.parquet")
    dup = pa.concat_tables([table, table.slice(0, 1)])
    dup = dup.set_column(dup.schema.get_field_index("provider"), "provider",
                         pc.if_else(pc.equal(dup["provider"], "Prov"), "Fireworks", dup["provider"]))
    bad = run_dir / "bad.parquet"
    pq.write_table(dup, bad)
    code, result = validate(run_dir, bad, max_failed_rate=0.01, max_length_rate=0.01, max_cost_usd=0.05)
    assert code == 1
    assert failed_columns(result) == {"prompt_id", "answered_by", "failed_rate", "length_rate", "total_cost_usd"}


JUNK = {
    "id0004": '{"error": {"message": "Upstream provider error", "code": 502}}',
    "id0005": ' [{"type": "text", "text": "Answer to p0005."}]\n',
    "id0006": "[{'type': 'text',\n  'text': 'Answer to p0006.'}]",
}


def test_the_gate_fails_on_kept_rows_whose_content_is_junk_though_status_says_ok(run_dir):
    table = with_column(healthy(run_dir), "content", JUNK)
    assert {r["prompt_id"]: (r["status"], r["failure_reason"]) for r in table.to_pylist()
            if r["prompt_id"] in JUNK} == dict.fromkeys(JUNK, ("ok", None))
    code, result = validate(run_dir, write(run_dir, table))
    assert code == 1
    assert failed_columns(result) == {"kept_junk", "failed_rate"}
    junk = failure(result, "kept_junk")
    assert junk["unexpected_count"] == 3
    assert sorted(junk["unexpected_sample"]) == ["content_parts_repr", "content_parts_repr", "leaked_error_body"]
    assert failure(result, "failed_rate")["observed_value"] == pytest.approx(5 / 20)   # 2 failed + 3 junk


@pytest.mark.parametrize("ignore, answered", [(["Fireworks"], "fireworks"), (["fireworks"], "FIREWORKS")])
def test_ignore_providers_matches_provider_names_ignoring_case(run_dir, ignore, answered):
    table = with_column(healthy(run_dir), "provider", {"id0007": answered})
    code, result = validate(run_dir, write(run_dir, table), ignore_providers=ignore)
    assert (code, failed_columns(result)) == (1, {"answered_by"})
    assert failure(result, "answered_by")["unexpected_sample"] == [answered]


def test_an_excluded_provider_on_a_failed_row_did_not_answer_and_passes(run_dir):
    table = with_column(healthy(run_dir), "provider", {"id0002": "Fireworks"})   # its 400
    code, result = validate(run_dir, write(run_dir, table))
    assert code == 0, [e for e in result["expectations"] if not e["success"]]


SAMPLES = [
    "plain prose", "", "  ", '"a JSON string"', "42", "[1, 2]", "[]", "{}", '{"error": null}', '{"result": 1}',
    '{"error": {"message": "x", "code": 502}}', '\n{"error": "upstream"}', '{"object": "error", "message": "m"}',
    '[{"type": "text", "text": "hi"}]', '[{"type": "text", "text": "a"}, {"x": 1}]', '[{"type": "fruit"}]',
    '[{"type": 5}]', '[{"type": "reasoning.text", "text": "t"}, {"type": "image_url"}]',
    "[{'type': 'text', 'text': 'hi'}]", "[{'text': 'a\nb', 'type': 'output_text'}]", "[{'type': 'textual'}]",
    "[{'type': 'text', 'text': 'cut", '[{"type": "text", "text": NaN}]', "\f[{'type': 'text'}]",
    "see [{'type': 'text'}]", '{"error": {"message": "x"}} trailing',
]


def test_the_suite_and_the_client_judge_junk_by_the_same_rule():
    view = json.loads(Path(SUITE).read_text())["view"]
    ids = [f"id{i:04d}" for i in range(len(SAMPLES))]
    responses = pa.Table.from_pylist([{"prompt_id": i, "status": "ok", "content": c} for i, c in zip(ids, SAMPLES)],
                                     schema=schema.responses())
    prompts = pa.table({"prompt_id": ids})  # noqa: F841  (DuckDB reads it by name)
    sql = dict(duckdb.sql(f"SELECT prompt_id, kept_junk FROM ({view})").fetchall())
    assert [sql[i] for i in ids] == [junk_reason(c) for c in SAMPLES]
    assert sum(x is not None for x in sql.values()) == 8


def test_an_empty_ignore_list_and_no_cost_ceiling_are_accepted(run_dir):
    code, result = validate(run_dir, run_dir / "responses" / "responses.parquet", ignore_providers=[],
                            max_cost_usd=None)
    assert code == 0, [e for e in result["expectations"] if not e["success"]]


def test_the_data_docs_say_the_provider_check_ignores_case(run_dir, tmp_path):
    validate(run_dir, run_dir / "responses" / "responses.parquet")
    docs = tmp_path / "docs"
    assert gates.main([SUITE, str(run_dir / "responses" / "responses.parquet"),
                       "--input", f"prompts={run_dir / 'prompts' / 'prompts.parquet'}",
                       "--params", str(run_dir / "gate_params.yaml"), "--docs", str(docs)]) == 0
    page = next((docs / "validations").rglob("*.html")).read_text()
    assert "must not be any of" in page and "Fireworks" in page and "ignoring case" in page
