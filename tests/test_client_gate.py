"""expectations/responses.json on a real generate run (scripted server), through `draftgate validate`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from draftgate import gates, schema
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
    with running(Script(replies={"p0001": LONG}, per_key={"p0002": ("http_400",)}, cost_usd=0.01)) as server:
        gp = {"backend": "openai", "model": "m", "base_url": server.base_url, "retry_base_s": 0.005}
        (tmp / "params.yaml").write_text(yaml.safe_dump({"generate": gp}))
        assert generate.main(["--params", str(tmp / "params.yaml"), "--prompts", str(tmp / "prompts" / "prompts.parquet"),
                              "--gate", str(tmp / "gate.json"), "--out", str(tmp / "responses"),
                              "--metrics", str(tmp / "metrics.json")]) == 0
    return tmp


def validate(run_dir: Path, responses: Path, **gate_params) -> tuple[int, dict]:
    params = yaml.safe_load((run_dir / "params.yaml").read_text())
    params["gates"] = {"responses": {"max_failed_rate": 0.1, "max_length_rate": 0.1,
                                     "ignore_providers": ["Fireworks"], "max_cost_usd": 1.0, **gate_params}}
    (run_dir / "gate_params.yaml").write_text(yaml.safe_dump(params))
    result = run_dir / "result.json"
    code = gates.main([SUITE, str(responses), "--input", f"prompts={run_dir / 'prompts' / 'prompts.parquet'}",
                       "--result", str(result), "--params", str(run_dir / "gate_params.yaml"), "--no-docs"])
    return code, json.loads(result.read_text())


def failed_columns(result: dict) -> set[str]:
    return {e["kwargs"].get("column") for e in result["expectations"] if not e["success"]}


def test_a_healthy_run_passes_the_responses_gate(run_dir):
    code, result = validate(run_dir, run_dir / "responses" / "responses.parquet")
    assert (code, result["success"], result["rows"]) == (0, True, 20)


def test_the_gate_fails_on_truncations_failures_excluded_providers_cost_and_duplicates(run_dir):
    table = pq.read_table(run_dir / "responses" / "responses.parquet")
    dup = pa.concat_tables([table, table.slice(0, 1)])
    dup = dup.set_column(dup.schema.get_field_index("provider"), "provider",
                         pc.if_else(pc.equal(dup["provider"], "Prov"), "Fireworks", dup["provider"]))
    bad = run_dir / "bad.parquet"
    pq.write_table(dup, bad)
    code, result = validate(run_dir, bad, max_failed_rate=0.01, max_length_rate=0.01, max_cost_usd=0.05)
    assert code == 1
    assert failed_columns(result) == {"prompt_id", "provider", "failed_rate", "length_rate", "total_cost_usd"}


def test_an_empty_ignore_list_and_no_cost_ceiling_are_accepted(run_dir):
    code, result = validate(run_dir, run_dir / "responses" / "responses.parquet", ignore_providers=[],
                            max_cost_usd=None)
    assert code == 0, [e for e in result["expectations"] if not e["success"]]
