"""One prefill for two stages (docs/repair.md): the repair stage's base pass captures the hidden
stage's features, keeps those of the rows whose ids it left as they were, and the hidden stage
copies them for the rows whose ids equal the table's and forwards only the others. With the real
SmolLM2 target and real token rows."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from draftgate.config import HiddenParams
from draftgate.hidden.reader import OfflineFeatures
from draftgate.prefill import PrefillWriter, feature_key, open_prefill
from draftgate.repair.score import HFScorer, Sampling
from hidden_fixtures import metrics_of, stage_args, token_rows, write_gate, write_params, write_tokens
from stages import hidden as stage

LAYERS = (1, 14, 26)
# bfloat16 as stored by the pipeline; 1 MB shards and 160-token forward batches, as test_hidden_shards.
PLAN = {"shard_max_mb": 1.0, "batch_tokens": 160}


@pytest.fixture(scope="module")
def target():
    from draftgate.target import load_target

    return load_target(HiddenParams(), device="cpu")


def base_pass(target, rows, dtype="bfloat16"):
    """The repair stage's batched base pass over `rows` (one forward), with the capture on:
    {prompt id: (aux, final)}."""
    scorer = HFScorer(target.model, Sampling(0.7), capture=(LAYERS, dtype))
    scorer.score_rows([(r["input_ids"], r["prompt_len"], None) for r in rows])
    out = {r["prompt_id"]: scorer.features(r["input_ids"]) for r in rows}
    scorer.release()
    return out


def write_prefill(directory, target, rows, features, dtype="bfloat16", layers=LAYERS):
    shutil.rmtree(directory, ignore_errors=True)
    writer = PrefillWriter(directory, feature_key(target, layers, dtype))
    writer.add([r["prompt_id"] for r in rows], [r["input_ids"] for r in rows],
               [features[r["prompt_id"]] for r in rows])
    return writer.close()


@pytest.fixture(scope="module")
def work(tmp_path_factory, smollm2_tok, target):
    work = tmp_path_factory.mktemp("prefill")
    rows = token_rows(smollm2_tok, 10)
    write_tokens(work / "tokens.parquet", rows)
    write_gate(work / "gate.json")
    params = write_params(work / "params.yaml", **PLAN)
    # Repair's base pass over the first six rows, in one batch of its own (not the hidden plan's).
    features = base_pass(target, rows[:6])
    write_prefill(work / "prefill", target, rows[:6], features)
    full = work / "full"
    assert stage.main(stage_args(work, full, params)) == 0           # the hidden stage alone
    return {"root": work, "rows": rows, "params": params, "features": features, "full": full}


def hidden_with(work, name, prefill):
    out = work["root"] / name
    assert stage.main(stage_args(work["root"], out, work["params"]) + ["--prefill", str(prefill)]) == 0
    return out, metrics_of(out)


def test_the_base_pass_captures_what_the_hidden_capture_takes_from_the_same_batch(target):
    from draftgate.hidden.capture import capture_rows

    ids = [torch.arange(100, 140), torch.arange(200, 230)]
    scorer = HFScorer(target.model, Sampling(0.7), capture=(LAYERS, "float32"))
    scorer.score_rows([(x.tolist(), 1, None) for x in ids])
    for x, (aux, final) in zip(ids, capture_rows(target, ids, LAYERS, torch.float32)):
        got = scorer.features(x.tolist())
        assert got[0].shape == aux.shape == (len(x), 3, 576) and got[1].shape == final.shape
        # The same tensors (blocks 1, 14, 26 and the last before the norm) from the same padded batch.
        torch.testing.assert_close(got[0], aux, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], final, rtol=1e-5, atol=1e-5)
    scorer.release()
    assert scorer.features(ids[0].tolist()) is None        # released with the batch's caches


def test_the_hidden_stage_copies_the_prefilled_rows_and_forwards_only_the_others(work):
    out, m = hidden_with(work, "shared", work["root"] / "prefill")
    rows = work["rows"]
    assert m["prefill_rows"] == 6 and m["extracted_rows"] == 4
    # Tokens forwarded: the four rows the prefill lacks, and nothing of the six it holds.
    assert m["extracted_tokens"] == sum(len(r["input_ids"]) for r in rows[6:])
    assert m["prefill_tokens"] == sum(len(r["input_ids"]) for r in rows[:6])
    shared = OfflineFeatures(out, work["root"] / "tokens.parquet", verify_hashes=True)
    full = OfflineFeatures(work["full"], work["root"] / "tokens.parquet", verify_hashes=True)
    assert shared.prompt_ids == full.prompt_ids == [r["prompt_id"] for r in rows]
    from draftgate.checks.hidden import rel_err, tolerance

    allowed = tolerance("bfloat16", 1.0, 0.001)          # the hidden gate's re-extraction tolerance
    for r in rows:
        s, f = shared.get(r["prompt_id"]), full.get(r["prompt_id"])
        assert s.input_ids.tolist() == r["input_ids"]
        if r["prompt_id"] in work["features"]:            # copied as the base pass stored them
            aux, final = work["features"][r["prompt_id"]]
            assert torch.equal(s.aux, aux) and torch.equal(s.final, final)
        # Another batching moves a bfloat16 value by a rounding step at most: inside the gate's tolerance.
        assert rel_err(s.aux, f.aux) <= allowed and rel_err(s.final, f.final) <= allowed
    # Byte-reproducible: the same table, prefill and params give the same shards.
    again, _ = hidden_with(work, "shared-again", work["root"] / "prefill")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == json.loads((again / "manifest.json").read_text())
    assert manifest["key"]["prefill_sha256"] == open_prefill(work["root"] / "prefill")[0].sha256


def test_a_prefilled_row_whose_ids_are_not_the_tables_is_forwarded_again(work, target):
    rows = work["rows"]
    # Row p0001 is stored with p0000's ids and features: a repaired row the prefill kept by mistake.
    liar = [rows[0], {**rows[0], "prompt_id": rows[1]["prompt_id"]}, rows[2]]
    features = {**work["features"], rows[1]["prompt_id"]: work["features"][rows[0]["prompt_id"]]}
    write_prefill(work["root"] / "liar", target, liar, features)
    out, m = hidden_with(work, "liar-out", work["root"] / "liar")
    assert m["prefill_rows"] == 2 and m["extracted_rows"] == 8
    s = OfflineFeatures(out, work["root"] / "tokens.parquet").get(rows[1]["prompt_id"])
    assert s.aux.shape[0] == len(rows[1]["input_ids"])
    full = OfflineFeatures(work["full"], work["root"] / "tokens.parquet").get(rows[1]["prompt_id"])
    from draftgate.checks.hidden import rel_err

    assert rel_err(s.final, full.final) < 0.008


def test_a_prefill_that_is_not_what_its_manifest_says_or_not_these_features_is_not_used(work, target):
    rows = work["rows"]
    bad = work["root"] / "flipped"
    write_prefill(bad, target, rows[:6], work["features"])
    shard = bad / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x40                                       # one feature byte
    shard.write_bytes(bytes(data))
    prefill, why = open_prefill(bad)
    assert prefill is None and "sha256" in why
    other = work["root"] / "other-layers"                  # features of other layers, honestly labelled
    write_prefill(other, target, rows[:6], work["features"], layers=(2, 14, 26))
    for directory, reason in ((bad, "sha256"), (other, "layers")):
        _, m = hidden_with(work, directory.name + "-out", directory)
        assert m["prefill_rows"] == 0 and m["extracted_rows"] == 10 and reason in m["prefill_unused"]


def test_online_mode_ignores_the_prefill(work):
    params = write_params(work["root"] / "online.yaml", mode="online", **PLAN)
    out = work["root"] / "online"
    assert stage.main(stage_args(work["root"], out, params) + ["--prefill", str(work["root"] / "prefill")]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mode"] == "online" and manifest["shards"] == [] and "prefill_sha256" not in manifest["key"]


def test_repair_keeps_the_features_of_the_rows_it_left_and_not_of_the_row_it_repaired(tmp_path, target):
    import pyarrow as pa

    from draftgate import schema
    from draftgate.config import RepairParams
    from draftgate.repair.run import Request, run
    from draftgate.repair.search import Vocab
    from draftgate.serve.model import smollm2_tokenizer
    from test_repair_score import local_model
    from test_repair_search import SAMPLING, TRANSPOSE, row

    lm = local_model()
    vocab = Vocab.from_tokenizer(smollm2_tokenizer())
    prompt, canon, truth = row(lm, vocab, TRANSPOSE)

    def tok_row(pid, completion, bill):
        return {"prompt_id": pid, "input_ids": prompt + completion, "prompt_len": len(prompt),
                "completion_ids": completion, "loss_mask": [0] * len(prompt) + [1] * len(completion),
                "method": "text", "n_completion": len(completion), "billed_completion_tokens": bill,
                "billing_convention": "counts_end", "billing_residual": len(completion) - bill}
    # "a": the model's " trans|pose", re-encoded canonically (repaired); "b": written canonically (kept).
    table = pa.Table.from_pylist([tok_row("a", canon, len(truth)), tok_row("b", truth[:20], 20)],
                                 schema=schema.tokens())
    writer = PrefillWriter(tmp_path / "prefill", feature_key(target, LAYERS, "bfloat16"))
    scorer = HFScorer(target.model, SAMPLING, capture=(LAYERS, "bfloat16"))
    result = run(Request(table, scorer, vocab, RepairParams(), prefill=writer))
    a, b = result.table.to_pylist()
    assert a["method"] == "repaired" and b["repair_status"] == "kept"
    assert result.metrics.figures["prefill_rows"] == 1
    assert result.metrics.figures["prefill_tokens"] == len(prompt) + 20
    prefill, why = open_prefill(tmp_path / "prefill")
    assert why == "" and set(prefill.ids) == {"b"} and prefill.ids["b"].tolist() == b["input_ids"]
    aux, final = prefill.features("b")
    assert aux.shape == (len(b["input_ids"]), 3, 576) and aux.dtype == torch.bfloat16


def test_features_shared_with_repair_pass_the_hidden_gate(tmp_path, target):
    """The gate stays the second opinion: its own re-extraction of every row, its final-state and
    aux-chain checks, over a hidden directory two of whose rows came from the prefill and whose
    third was stored there under another row's ids (so forwarded again)."""
    from test_hidden_gate_files import greedy_world, run_hidden_gate

    world = greedy_world(tmp_path)
    rows = [{**r, "prompt_len": 1} for r in world["kept"]]
    features = base_pass(target, rows)
    liar = rows[:2] + [{**rows[0], "prompt_id": rows[2]["prompt_id"]}]
    write_prefill(tmp_path / "prefill", target, liar, {**features, rows[2]["prompt_id"]: features[rows[0]["prompt_id"]]})
    out = tmp_path / "hidden"
    args = ["--params", str(world["params"]), "--tokens", str(world["tokens"]),
            "--gate", str(write_gate(tmp_path / "gate.json")), "--out", str(out),
            "--metrics", str(tmp_path / "m" / "hidden.json"), "--prefill", str(tmp_path / "prefill")]
    assert stage.main(args) == 0
    m = json.loads((tmp_path / "m" / "hidden.details.json").read_text())
    assert m["prefill_rows"] == 2 and m["extracted_rows"] == 1
    result = run_hidden_gate(out, world["tokens"], world["params"])
    assert result["success"], [e for e in result["expectations"] if not e["success"]]
    assert len(result["computed"]["report"]["resampled"]) == 3


def test_only_the_in_process_pair_or_an_engine_draftgate_starts_for_both_stages_shares_the_prefill():
    from draftgate.config import parse_params
    from draftgate.repair.run import prefill_skipped

    def skipped(repair: dict, hidden: dict):
        return prefill_skipped(parse_params({"repair": repair, "hidden": hidden}))

    assert skipped({"backend": "hf"}, {"backend": "in_process"}) is None
    assert skipped({"backend": "vllm"}, {"backend": "vllm"}) is None           # repair/engine.py starts it
    assert "repair.base_url" in skipped({"backend": "vllm", "base_url": "http://127.0.0.1:9/v1"}, {"backend": "vllm"})
    assert "hidden.backend in_process" in skipped({"backend": "vllm"}, {"backend": "in_process"})
    assert "hidden.backend vllm" in skipped({"backend": "hf"}, {"backend": "vllm"})
    assert "hidden.mode online" in skipped({"backend": "hf"}, {"mode": "online"})
    assert "repair.backend sglang" in skipped({"backend": "sglang", "base_url": "http://127.0.0.1:9"}, {})
