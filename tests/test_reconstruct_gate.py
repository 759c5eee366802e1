"""The tokens gate (expectations/tokens.json) on tables reconstructed from small dicts.

Each test runs the real gate (DuckDB view -> GX) through `draftgate validate`'s main and reads
which expectations failed from the result file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from draftgate import gates
from draftgate.reconstruct.core import Setup
from draftgate.reconstruct.table import reconstruct_table
from draftgate.templates import get_template

SUITE = Path(__file__).resolve().parents[1] / "expectations" / "tokens.json"
THRESHOLDS = {"max_billing_delta_rate": 0.0004, "min_row_billing_agreement": 0.98,
              "max_mismatch_rate": 0.5, "max_semantic": 0, "max_quarantine_rate": 0.05}


def tables(rows, prompts):
    import pyarrow as pa

    from draftgate import schema

    full = [{f: r.get(f) for f in schema.responses().names} for r in rows]
    return pa.Table.from_pylist(full, schema=schema.responses()), pa.Table.from_pylist(prompts)


def prompt(pid):
    return {"prompt_id": pid, "dataset": "chat", "split": "train", "tools": None,
            "messages": json.dumps([{"role": "user", "content": f"Say hello ({pid})."}])}


def resp(pid, content, truth, billed):
    return {"prompt_id": pid, "dataset": "chat", "status": "ok", "finish_reason": "stop",
            "content": content, "provider": "local", "truth_ids": truth, "billed_completion_tokens": billed}


def run_gate(tmp_path, tok, template, ids, rows, prompts, **thresholds):
    responses, prompts = tables(rows, prompts)
    table, _, _ = reconstruct_table(responses, prompts, Setup(tok, get_template(template), ids, False))
    import pyarrow.parquet as pq

    pq.write_table(table, tmp_path / "tokens.parquet")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"gates": {"tokens": {**THRESHOLDS, **thresholds}}}))
    code = gates.main([str(SUITE), str(tmp_path / "tokens.parquet"), "--result", str(tmp_path / "r.json"),
                       "--params", str(tmp_path / "params.yaml"), "--no-docs"])
    result = json.loads((tmp_path / "r.json").read_text())
    failed = {e["kwargs"].get("column") for e in result["expectations"] if not e["success"]}
    return code, failed, table


def names(tok, template):
    return {n: tok.token_id(n) for n in get_template(template).special_names}


@pytest.fixture()
def good_rows(qwen3_tok):
    texts = ["Hello!", "Hi there.", "Hello, world."]
    rows = []
    for k, text in enumerate(texts):
        truth = qwen3_tok.encode(text + "<|im_end|>")
        rows.append(resp(f"p{k}", text, truth, len(truth)))
    return rows, [prompt(f"p{k}") for k in range(len(texts))]


def test_sound_exact_rows_with_agreeing_bills_pass_the_gate(tmp_path, qwen3_tok, good_rows):
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), *good_rows)
    assert (code, failed) == (0, set())


def test_the_163533_replay_fails_the_gate(tmp_path, kimi_standin_tok):
    # A contract whose <|im_end|> is 163533 (an ordinary token on Kimi) against truth ids that
    # end with the real 163586.
    tok = kimi_standin_tok
    rows, prompts = [], []
    for k, text in enumerate(["Hello!", "Hi there."]):
        truth = tok.encode(text + "<|im_end|>")
        rows.append(resp(f"p{k}", text, truth, len(truth)))
        prompts.append(prompt(f"p{k}"))
    ids = names(tok, "kimi_k2") | {"<|im_end|>": 163533}
    code, failed, table = run_gate(tmp_path, tok, "kimi_k2", ids, rows, prompts)
    assert code == 1
    assert {"n_semantic", "quarantine_rate"} <= failed
    assert set(table.column("match").to_pylist()) == {"semantic"}


def test_a_contract_id_that_text_can_produce_shows_up_as_a_special_id_in_text(tmp_path, qwen3_tok):
    # On Qwen3, point <|im_end|> at the ordinary token "Hello": content "Hello" encodes to it.
    hello = qwen3_tok.encode_ordinary("Hello")
    assert len(hello) == 1
    ids = names(qwen3_tok, "qwen3") | {"<|im_end|>": hello[0]}
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", ids,
                               [resp("p0", "Hello", None, 2)], [prompt("p0")], max_quarantine_rate=1.0)
    assert code == 1
    assert "special_id_in_text" in failed


def test_billing_that_disagrees_beyond_the_aggregate_threshold_fails(tmp_path, qwen3_tok, good_rows):
    rows, prompts = good_rows
    rows = [dict(r, billed_completion_tokens=r["billed_completion_tokens"] + 1) for r in rows]
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), rows, prompts)
    assert code == 1
    assert failed == {"kept_billing_residual", "billing_row_agreement"}


def test_a_semantic_row_where_truth_is_known_fails_and_the_mismatch_rate_is_per_dataset(tmp_path, qwen3_tok, good_rows):
    rows, prompts = good_rows
    truth = qwen3_tok.encode("Hello!  <|im_end|>")   # the provider trimmed two spaces
    rows = rows + [resp("p9", "Hello!", truth, len(truth))]
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), rows,
                               prompts + [prompt("p9")], max_mismatch_rate=0.2)
    assert code == 1
    assert failed == {"n_semantic", "dataset_mismatch_rate"}
