"""The streamed table pass: Arrow assembly, chunking, billing over the whole table, the report."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from draftgate import schema
from draftgate.reconstruct.core import Setup
from draftgate.reconstruct.table import mismatch_report, plot_rows, to_arrow
from draftgate.templates import get_template
from reconstruct_fixtures import reconstruct_tables


def tables(qwen3_tok, n=5, excludes_end=True):
    prompts, responses = [], []
    for k in range(n):
        text = f"Answer number {k}."
        truth = qwen3_tok.encode(text + "<|im_end|>")
        prompts.append({"prompt_id": f"p{k}", "dataset": "a" if k % 2 else "b", "split": "train",
                        "tools": None, "messages": json.dumps([{"role": "user", "content": f"Q{k}"}])})
        responses.append({"prompt_id": f"p{k}", "dataset": prompts[-1]["dataset"], "status": "ok",
                          "finish_reason": "stop", "content": text, "provider": "prov",
                          "truth_ids": truth if k != 1 else None,
                          "billed_completion_tokens": len(truth) - (1 if excludes_end else 0)})
    full = [{f: r.get(f) for f in schema.responses().names} for r in responses]
    return pa.Table.from_pylist(full, schema=schema.responses()), pa.Table.from_pylist(prompts)


def setup(tok):
    t = get_template("qwen3")
    return Setup(tok, t, {n: tok.token_id(n) for n in t.special_names}, False)


def test_to_arrow_matches_pyarrows_own_conversion_including_null_lists():
    rows = [{f.name: None for f in schema.tokens()} for _ in range(3)]
    rows[0].update(prompt_id="a", input_ids=[1, 2, 3, 4], completion_ids=[3, 4], prompt_len=2, loss_mask=[0, 0, 1, 1])
    rows[1].update(prompt_id="b")
    rows[2].update(prompt_id="c", input_ids=[5, 6], completion_ids=[], prompt_len=2, loss_mask=[0, 0])
    assert to_arrow(rows).equals(pa.Table.from_pylist(rows, schema=schema.tokens()))


def test_chunks_do_not_change_the_result_and_billing_is_measured_over_the_whole_table(qwen3_tok):
    responses, prompts = tables(qwen3_tok)
    whole, _, summary = reconstruct_tables(responses, prompts, setup(qwen3_tok))
    chunked, _, summary2 = reconstruct_tables(responses, prompts, setup(qwen3_tok), chunk=2)
    assert whole.equals(chunked) and summary == summary2
    # The provider bills without the end token: learned from the truth rows, and every residual
    # (the text-only row's included) is 0 under it.
    prov = summary["by_provider"]["prov"]
    assert (prov["completion"], prov["completion_source"], prov["completion_learned_from"]) == \
        ("excludes_end", "learned", 4)
    assert set(whole.column("billing_residual").to_pylist()) == {0}
    assert set(whole.column("billing_delta").to_pylist()) == {1}


def test_billing_mismatch_quarantines_only_when_asked(qwen3_tok):
    responses, prompts = tables(qwen3_tok)
    bills = responses.column("billed_completion_tokens").to_pylist()
    bills[0] += 3
    responses = responses.set_column(responses.schema.get_field_index("billed_completion_tokens"),
                                     "billed_completion_tokens", pa.array(bills, pa.int64()))
    kept, _, _ = reconstruct_tables(responses, prompts, setup(qwen3_tok), "keep")
    quarantined, result, _ = reconstruct_tables(responses, prompts, setup(qwen3_tok), "quarantine")
    assert kept.column("quarantine_reason").null_count == 5
    assert quarantined.column("quarantine_reason").to_pylist()[0] == "billing_mismatch"
    assert result.counts["quarantine"] == {"billing_mismatch": 1}


def test_the_report_counts_per_dataset_and_the_mismatch_rate_only_where_truth_is_known(qwen3_tok):
    responses, prompts = tables(qwen3_tok)
    table, _, summary = reconstruct_tables(responses, prompts, setup(qwen3_tok))
    report = mismatch_report(table, summary)
    assert report["datasets"]["a"]["unknown"] == 1 and report["datasets"]["a"]["exact"] == 1
    assert report["datasets"]["b"]["exact"] == 3 and report["datasets"]["all"]["rows"] == 5
    assert report["datasets"]["a"]["mismatch_rate"] == 0.0
    assert [r["dataset"] for r in plot_rows(report)] == ["a", "b", "all"]


def test_split_rows_make_the_same_table_as_joined_rows(qwen3_tok):
    from draftgate.reconstruct.core import reconstruct

    responses, prompts = tables(qwen3_tok, n=6)
    rows = responses.to_pylist()
    rows[2]["status"] = "error"                           # quarantined before it has ids: null lists
    rows[3]["truth_ids"] = [qwen3_tok.vocab_size + 1]     # quarantined on its truth ids: null lists
    rows[4]["truth_ids"] = qwen3_tok.encode("Other text.<|im_end|>")   # truth differs from the text
    prompt_rows = {p["prompt_id"]: p for p in prompts.to_pylist()}
    joined = to_arrow(reconstruct(rows, prompt_rows, setup(qwen3_tok)).rows)
    split = to_arrow(reconstruct(rows, prompt_rows, setup(qwen3_tok), joined=False).rows)
    assert split.equals(joined)
    assert joined.column("input_ids").null_count == 2
    assert joined.column("match").to_pylist()[4] == "semantic"


def test_to_arrow_refuses_rows_that_are_neither_joined_nor_split():
    from draftgate.reconstruct.core import PROMPT_IDS

    row = {f.name: None for f in schema.tokens()}
    row.update(prompt_id="a", completion_ids=[3], prompt_len=1, **{PROMPT_IDS: [1]})
    half = dict(row, **{"prompt_id": "b", PROMPT_IDS: None})
    with pytest.raises(ValueError, match=r"rows \['b'\] are neither joined nor split"):
        to_arrow([row, half])


def test_the_cyclic_collector_is_paused_during_the_run_and_left_as_it_was(qwen3_tok, monkeypatch):
    import gc

    from draftgate.reconstruct import table as t

    seen = []
    real = t.reconstruct
    monkeypatch.setattr(t, "reconstruct", lambda *a, **k: seen.append(gc.isenabled()) or real(*a, **k))
    responses, prompts = tables(qwen3_tok)
    assert gc.isenabled()
    reconstruct_tables(responses, prompts, setup(qwen3_tok))
    assert gc.isenabled() and seen == [False]
    gc.disable()
    try:
        reconstruct_tables(responses, prompts, setup(qwen3_tok))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_bytes_index_is_built_for_logprobs_rows_without_truth_and_only_then(qwen3_tok, monkeypatch):
    from draftgate.reconstruct import table as t

    built = []
    real = t.BytesIndex
    monkeypatch.setattr(t, "BytesIndex", lambda *a: built.append(1) or real(*a))
    responses, prompts = tables(qwen3_tok, n=3)
    ids = qwen3_tok.encode("Answer number 1.")
    logprobs = json.dumps({"content": [{"token": "x", "logprob": -0.1, "bytes": list(qwen3_tok.token_bytes(i)),
                                        "top_logprobs": []} for i in ids]})
    rows = responses.to_pylist()
    rows[0]["logprobs"], rows[2]["logprobs"] = logprobs, ""      # row 0 has truth ids; row 2's are empty
    table, _, _ = reconstruct_tables(pa.Table.from_pylist(rows, schema=schema.responses()), prompts, setup(qwen3_tok))
    assert built == [] and table.column("method").to_pylist() == ["truth", "text", "truth"]
    rows[1]["logprobs"] = logprobs                                  # row 1 has none: the index is needed
    table, _, _ = reconstruct_tables(pa.Table.from_pylist(rows, schema=schema.responses()), prompts, setup(qwen3_tok))
    assert built == [1] and table.column("method").to_pylist() == ["truth", "logprobs", "truth"]


@pytest.mark.parametrize("shuffled", [False, True])
def test_responses_out_of_prompt_order_and_small_chunks_give_the_same_rows(tmp_path, qwen3_tok, shuffled):
    import pyarrow.parquet as pq

    from draftgate.reconstruct.table import PromptsInStep, reconstruct_files

    responses, prompts = tables(qwen3_tok, n=9)
    ordered, result, summary = reconstruct_tables(responses, prompts, setup(qwen3_tok))   # one chunk
    order = [4, 0, 8, 2, 6, 1, 3, 5, 7] if shuffled else list(range(9))
    responses = responses.take(order)
    pq.write_table(responses, tmp_path / "responses.parquet")
    pq.write_table(prompts, tmp_path / "prompts.parquet")
    counts, summary2, rows = reconstruct_files(tmp_path / "responses.parquet", tmp_path / "prompts.parquet",
                                               tmp_path / "out" / "tokens.parquet", setup(qwen3_tok), chunk=2)
    assert pq.read_table(tmp_path / "out" / "tokens.parquet").equals(ordered.take(order)) and rows == 9
    assert summary2 == summary and counts.counts == result.counts
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tokens.parquet"]   # no part file left
    step = PromptsInStep(tmp_path / "prompts.parquet")
    for chunk in (responses.column("prompt_id").to_pylist()[k:k + 2] for k in range(0, 9, 2)):
        assert set(chunk) <= set(step(chunk))
    assert step.in_step is not shuffled


def test_prompts_in_step_hold_only_the_window_of_the_current_chunk(tmp_path):
    import pyarrow.parquet as pq

    from draftgate.reconstruct.table import PromptsInStep

    n = 20_000
    prompts = pa.table({"prompt_id": [f"p{k:06d}" for k in range(n)], "dataset": ["d"] * n,
                        "messages": ["[]"] * n, "tools": [None] * n, "split": ["train"] * n})
    pq.write_table(prompts, tmp_path / "prompts.parquet")
    pq.write_table(prompts.select(["prompt_id"]), tmp_path / "responses.parquet")
    step = PromptsInStep(tmp_path / "prompts.parquet")
    held = []
    for start in range(0, n, 1000):
        wanted = [f"p{k:06d}" for k in range(start, start + 1000)]
        rows = step(wanted)
        assert all(w in rows for w in wanted)
        held.append(len(rows))
    assert max(held) <= 1000 + 4096     # the chunk plus at most one read-ahead batch
