"""Acceptance measured by the real engine: `eval.engine: vllm` and the eval gate's hold on it.

One vLLM engine for the module (eager; tests/engine_fixtures.py): the eval stage serves the shared
tiny trained drafter's speculators export (tests/drafter_fixtures.py) under vLLM's own EAGLE-3
decoding on three held-out prompts (k=3, 24 tokens), beside our own replay of the SGLang export.
The engine's counters must equal the replay's and its outputs the gate's greedy decoding; each
check is shown failing on corrupted data (a counter in the scrape, a token of the engine's output,
the engine's record missing). And an SGLang export whose aux layers vLLM would read one layer
early fails the drafter gate before anyone serves it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from drafter_fixtures import run_drafter_gate, trained, ws  # noqa: F401 (the module's fixtures)
from engine_fixtures import START_TIMEOUT_S, engine_python
from eval_fixtures import contract, tokens_table
from hidden_fixtures import TEXTS

# Training prompts of the tiny drafter (its 8 rows): on their greedy answers it accepts something.
PROMPTS = [TEXTS[6][0], TEXTS[3][0], TEXTS[4][0]]
EVAL = {"proposers": ["eagle3"], "k": 3, "max_new_tokens": 24, "bootstrap_samples": 100, "device": "cpu",
        "threads": 1, "batch_size": 4, "engine": "vllm"}


def write_params(path: Path, python: Path | None = None, **eval_) -> Path:
    data = {"hidden": {"device": "cpu"}, "eval": {**EVAL, **eval_},
            "gates": {"eval": {"min_acceptance_length": 1.0}}}
    if python is not None:
        data["engine"] = {"python": str(python), "kvcache_gib": 1, "start_timeout_s": START_TIMEOUT_S}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def staged(trained, tmp_path_factory, smollm2_tok):
    from draftgate.serve.model import resolve_end_ids
    from stages.eval import main

    python = engine_python()
    work = tmp_path_factory.mktemp("engine_eval")
    (work / "gate.json").write_text(json.dumps({"success": True, "checks": 1, "failed": 0}))
    tokens_table(work / "tokens.parquet", smollm2_tok, PROMPTS)
    contract(work / "contract.json", min(resolve_end_ids(smollm2_tok.hf)))
    rc = main(["--params", str(write_params(work / "params.yaml", python)), "--tokens", str(work / "tokens.parquet"),
               "--contract", str(work / "contract.json"), "--drafter", str(trained / "drafter" / "sglang"),
               "--speculators", str(trained / "drafter" / "speculators"), "--gate", str(work / "gate.json"),
               "--out", str(work / "out"), "--metrics", str(work / "metrics" / "eval.json"),
               "--plot", str(work / "plot.csv")])
    assert rc == 0
    return work


def gate(work: Path, outputs: Path | None = None, engine: Path | None = None,
         params: Path | None = None) -> tuple[int, dict]:
    from stages.gate_eval import main

    rc = main(["eval", str(outputs or work / "out" / "outputs.parquet"),
               "--input", f"tokens={work / 'tokens.parquet'}",
               "--input", f"engine={engine or work / 'out' / 'engine.json'}",
               "--params", str(params or write_params(work / "gate_params.yaml")),
               "--no-docs", "--result", str(work / "result.json"), "--metric", str(work / "metric.json")])
    result = json.loads((work / "result.json").read_text())
    assert rc in (0, 1), result.get("error")
    return rc, {e["kwargs"].get("column", e["type"]): e for e in result["expectations"]}


def test_the_engines_counters_equal_the_replays_at_every_position(staged):
    details = json.loads((staged / "metrics" / "eval.details.json").read_text())
    e = details["engine"]
    assert e["counts_equal"] is True
    assert e["drafts"] == e["replay_drafts"] > 0 and e["accepted"] == e["replay_accepted"] > 0
    assert e["draft_tokens"] == 3 * e["drafts"]                     # k drafts per step
    assert set(e["per_position"]) == {"1", "2", "3"}
    assert all(p["engine"] == p["replay"] for p in e["per_position"].values())
    assert e["acceptance_length"] == e["replay_acceptance_length"] == details["drafter"]["vllm_acceptance_length"]
    # The metric DVC shows keeps the headline figures; the per-position block is in the details.
    metric = json.loads((staged / "metrics" / "eval.json").read_text())["engine"]
    assert metric["acceptance_length"] == e["acceptance_length"] and "per_position" not in metric


def test_the_engines_outputs_are_rows_of_the_outputs_table_equal_to_the_replays(staged):
    import pyarrow.parquet as pq

    rows = pq.read_table(staged / "out" / "outputs.parquet").to_pylist()
    engine = {r["prompt_id"]: r for r in rows if r["proposer"] == "vllm"}
    replay = {r["prompt_id"]: r for r in rows if r["proposer"] == "eagle3"}
    assert set(engine) == set(replay) == {"h0", "h1", "h2"}
    assert all(engine[p]["output_ids"] == replay[p]["output_ids"] for p in engine)
    assert all(engine[p]["drafted"] is None for p in engine)        # the engine reports counters, not steps
    record = json.loads((staged / "out" / "engine.json").read_text())
    assert record["engine"] == "vllm" and "vllm:spec_decode_num_drafts_total" in record["metrics_after"]
    assert "--speculative-config" in record["command"]


def test_the_gate_passes_the_engines_measurement_as_written(staged):
    rc, checks = gate(staged)
    assert rc == 0, {k: v for k, v in checks.items() if not v["success"]}
    assert checks["engine_counts_differ"]["success"] and checks["engine_not_measured"]["success"]


def test_one_more_accepted_token_in_the_engines_scrape_fails_the_gate(staged):
    record = json.loads((staged / "out" / "engine.json").read_text())
    lines = []
    for line in record["metrics_after"].splitlines():
        if line.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{") and 'position="1"' in line:
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) + 1}"
        lines.append(line)
    bad = staged / "engine_counter.json"
    bad.write_text(json.dumps({**record, "metrics_after": "\n".join(lines)}))
    rc, checks = gate(staged, engine=bad)
    assert rc == 1
    failed = checks["engine_counts_differ"]
    assert not failed["success"] and "accepted_at_position_2: engine" in failed["unexpected_sample"][0]
    assert checks["diverges_from_greedy"]["success"]


def test_one_changed_token_of_the_engines_output_fails_the_gate(staged):
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(staged / "out" / "outputs.parquet")
    rows = pq.read_table(staged / "out" / "outputs.parquet").to_pylist()
    victim = next(r for r in rows if r["proposer"] == "vllm" and len(r["output_ids"]) > 4)
    victim["output_ids"][3] = (victim["output_ids"][3] + 1) % 49152
    bad = staged / "engine_token.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), bad)
    rc, checks = gate(staged, outputs=bad)
    assert rc == 1
    failed = checks["diverges_from_greedy"]
    assert f"vllm_eagle3: {victim['prompt_id']} leaves greedy at token 3" in failed["unexpected_sample"][0]


def test_an_engine_that_did_not_run_fails_the_gate_when_params_ask_for_it(staged):
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(staged / "out" / "outputs.parquet")
    replay_only = [r for r in pq.read_table(staged / "out" / "outputs.parquet").to_pylist() if r["proposer"] != "vllm"]
    bad = staged / "replay_only.parquet"
    pq.write_table(pa.Table.from_pylist(replay_only, schema=schema), bad)
    record = staged / "replay.json"
    record.write_text(json.dumps({"engine": "replay"}))
    rc, checks = gate(staged, outputs=bad, engine=record)
    assert rc == 1
    assert "engine.json records replay, the outputs hold 0 engine rows" in \
        checks["engine_not_measured"]["unexpected_sample"][0]
    assert "not measured" in checks["engine_counts_differ"]["unexpected_sample"][0]


def test_an_sglang_export_that_vllm_reads_one_layer_early_fails_the_drafter_gate(ws, trained, tmp_path):
    # The trained export carries vLLM's convention at the top level; without it vLLM takes
    # eagle_config's 0-based layer outputs as its capture points (the demo: acceptance 1.2107
    # against 1.2247, docs/engines.md "Acceptance").
    d = tmp_path / "sglang"
    shutil.copytree(trained / "drafter" / "sglang", d)
    cfg = json.loads((d / "config.json").read_text())
    trained_on = cfg.pop("eagle_aux_hidden_state_layer_ids")
    assert [i - 1 for i in trained_on] == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    (d / "config.json").write_text(json.dumps(cfg))
    rc, failed, result = run_drafter_gate(ws, trained, tmp_path, sglang=d)
    assert rc == 1 and failed == {"vllm_misreads"}
    said = result["computed"]["report"]["problems"]["sglang"]
    assert f"vLLM reads eagle_config.eagle_aux_hidden_state_layer_ids {[i - 1 for i in trained_on]}" in said
    assert f"trained on {trained_on}" in said
