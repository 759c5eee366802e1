"""The reconstruct stage's CLI on small temp tables built from dicts (real Qwen3 tokenizer)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from draftgate import schema
from stages import reconstruct as stage

REPO = Path(__file__).resolve().parents[1]
QWEN3_NAMES = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
               "<tool_response>", "</tool_response>")


def write_inputs(d: Path, qwen3_tok, *, gate_ok=True, ids=None) -> list[str]:
    prompts = [{"prompt_id": f"p{k}", "dataset": ds, "split": "train", "source": f"raw/{ds}.jsonl:{k}",
                "n_duplicates": 0, "tools": None,
                "messages": json.dumps([{"role": "user", "content": f"Question {k}?"}])}
               for k, ds in enumerate(["chat", "chat", "code", "code"])]
    truth = qwen3_tok.encode("<think>\nHm.\n</think>\n\nAnswer.<|im_end|>")

    def resp(pid, ds, **kw):
        base = {"prompt_id": pid, "dataset": ds, "status": "ok", "finish_reason": "stop",
                "reasoning": "Hm.", "content": "Answer.", "provider": "local",
                "billed_completion_tokens": len(truth), "truth_ids": truth}
        return {f: {**base, **kw}.get(f) for f in schema.responses().names}

    responses = [resp("p0", "chat"), resp("p1", "chat", truth_ids=None),
                 resp("p2", "code", reasoning_details=json.dumps([{"type": "reasoning.encrypted", "data": "x"}])),
                 resp("p3", "code", status="failed", failure_reason="http_500", finish_reason=None)]
    pq.write_table(pa.Table.from_pylist(prompts, schema=schema.prompts()), d / "prompts.parquet")
    pq.write_table(pa.Table.from_pylist(responses, schema=schema.responses()), d / "responses.parquet")
    (d / "contract.json").write_text(json.dumps(
        {"special_ids": ids or {n: qwen3_tok.token_id(n) for n in QWEN3_NAMES}}))
    (d / "gate.json").write_text(json.dumps({"success": gate_ok}))
    (d / "params.yaml").write_text(yaml.safe_dump({
        "tokenizer": {"kind": "qwen3"}, "template": {"name": "qwen3", "thinking": True},
        "reconstruct": {"method": "auto", "on_billing_mismatch": "keep"}}))
    return ["--params", str(d / "params.yaml"), "--contract", str(d / "contract.json"),
            "--prompts", str(d / "prompts.parquet"), "--responses", str(d / "responses.parquet"),
            "--gate", str(d / "gate.json"), "--out", str(d / "tokens"), "--metrics", str(d / "m.json"),
            "--report", str(d / "mismatch.json"), "--plot", str(d / "mismatch.csv")]


def test_stage_writes_tokens_metrics_report_and_plot(tmp_path, qwen3_tok):
    assert stage.main(write_inputs(tmp_path, qwen3_tok)) == 0
    table = pq.read_table(tmp_path / "tokens" / "tokens.parquet")
    assert table.schema.equals(schema.tokens())
    rows = {r["prompt_id"]: r for r in table.to_pylist()}
    assert (rows["p0"]["method"], rows["p0"]["match"], rows["p0"]["quarantine_reason"]) == ("truth", "exact", None)
    assert (rows["p1"]["method"], rows["p1"]["match"]) == ("text", "unknown")
    assert rows["p2"]["quarantine_reason"] == "reasoning_encrypted"
    assert rows["p3"]["quarantine_reason"] == "response_failed:http_500"

    m = json.loads((tmp_path / "m.json").read_text())
    assert (m["rows_in"], m["rows_out"]) == (4, 2)
    assert m["drops_by_reason"] == {"reasoning_encrypted": 1, "response_failed:http_500": 1}
    assert m["match"] == {"exact": 1, "unknown": 1}
    assert m["billing"]["completion"]["rows"] == 2 and "by_provider" not in m["billing"]   # a breakdown
    assert json.loads((tmp_path / "m.details.json").read_text())["billing"]["by_provider"]["local"]["rows"] == 2

    report = json.loads((tmp_path / "mismatch.details.json").read_text())
    assert report["datasets"]["chat"] == {
        "rows": 2, "kept": 2, "exact": 1, "bpe_only": 0, "semantic": 0, "unknown": 1,
        "not_reconstructed": 0, "mismatch_rate": 0.0, "billing_row_agreement": 1.0,
        "prompt_billing_row_agreement": None}
    assert report["datasets"]["code"]["not_reconstructed"] == 2
    # The metric DVC shows: the same figures, numbers only (no nulls, names or lists); the billing
    # block is reconstruct's metric's, shown there once.
    metric = json.loads((tmp_path / "mismatch.json").read_text())
    assert metric["datasets"]["chat"] == {k: v for k, v in report["datasets"]["chat"].items() if v is not None}
    assert "billing" not in metric and report["billing"]["by_provider"]["local"]["rows"] == 2
    assert all(isinstance(v, (int, float)) for ds in metric["datasets"].values() for v in ds.values())
    plot = list(csv.DictReader((tmp_path / "mismatch.csv").open()))
    assert [p["dataset"] for p in plot] == ["chat", "code", "all"]


def test_stage_refuses_to_run_after_a_failed_responses_gate(tmp_path, qwen3_tok, capsys):
    assert stage.main(write_inputs(tmp_path, qwen3_tok, gate_ok=False)) == 1
    assert "gate_responses did not pass (success: False)" in capsys.readouterr().err
    assert not (tmp_path / "tokens").exists()


def test_stage_refuses_a_contract_whose_id_is_an_ordinary_token_naming_it(tmp_path, qwen3_tok, capsys):
    ids = {n: qwen3_tok.token_id(n) for n in QWEN3_NAMES} | {"<|im_end|>": qwen3_tok.encode_ordinary("chas")[0]}
    assert stage.main(write_inputs(tmp_path, qwen3_tok, ids=ids)) == 1
    err = capsys.readouterr().err
    assert f"<|im_end|> -> {ids['<|im_end|>']}, which is the token b'chas'" in err
    assert "rerun the contract stage" in err


def test_stage_runs_as_a_module_from_the_command_line(tmp_path, qwen3_tok):
    args = write_inputs(tmp_path, qwen3_tok)
    out = subprocess.run([sys.executable, "-m", "stages.reconstruct", *args], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "4 responses -> 2 kept, 2 quarantined" in out.stdout
