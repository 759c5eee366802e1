"""Chunks reconstructed in worker processes: the same bytes, counts and billing as the serial path,
and a worker's error raised in the caller with nothing written."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftgate import schema
from draftgate.reconstruct.core import ReconstructError, Setup
from draftgate.reconstruct.table import reconstruct_files
from draftgate.templates import get_template

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.reconstruct import full_string, synthetic  # noqa: E402

PROVIDERS = ["alpha", "Beta", "gamma"]


def mixed_tables(tok, n=150):
    """The bench's synthetic rows, varied: three providers billing differently, truth and logprob
    ids (some differing from the text), failures, a prompt that is not there, truncation."""
    prompts, responses = synthetic(n, seed=3)
    for k, r in enumerate(responses):
        r["provider"] = PROVIDERS[k % 3]
        truth = tok.encode(full_string(r))
        if k % 3 != 2:      # gamma: no bills
            r["billed_completion_tokens"] = len(truth) - (k % 3) + (5 if k % 37 == 0 else 0)
        if k % 4 == 0:
            r["truth_ids"] = truth if k % 8 else tok.encode(full_string(r).replace("\n", " \n", 1))
        elif k == 61:
            r["logprobs"] = json.dumps({"content": [{"token": "x", "logprob": -0.1, "bytes": list(tok.token_bytes(i)),
                                                     "top_logprobs": []} for i in truth]})
        if k % 29 == 5:
            r.update(status="failed", failure_reason="http_500", finish_reason=None)
        if k % 31 == 7:
            r.update(finish_reason="length", content=r["content"][:40])
    responses[90]["prompt_id"] = "nowhere"
    responses[100]["truth_ids"] = [tok.vocab_size + 3]
    full = [{f: r.get(f) for f in schema.responses().names} for r in responses]
    return pa.Table.from_pylist(full, schema=schema.responses()), pa.Table.from_pylist(prompts)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, qwen3_tok):
    d = tmp_path_factory.mktemp("parallel")
    responses, prompts = mixed_tables(qwen3_tok)
    pq.write_table(responses, d / "responses.parquet", row_group_size=50)
    pq.write_table(prompts, d / "prompts.parquet")
    t = get_template("qwen3")
    return d, Setup(qwen3_tok, t, {n: qwen3_tok.token_id(n) for n in t.special_names}, True)


def run(inputs, out, workers, mismatch="quarantine", chunk=16):
    d, setup = inputs
    counts, summary, rows = reconstruct_files(d / "responses.parquet", d / "prompts.parquet", d / out, setup,
                                              mismatch, chunk=chunk, workers=workers)
    return hashlib.sha256((d / out).read_bytes()).hexdigest(), counts, summary, rows


def test_workers_write_the_serial_paths_bytes_counts_examples_and_billing(inputs):
    serial = run(inputs, "serial.parquet", workers=1)
    forked = run(inputs, "forked.parquet", workers=2)
    assert forked[0] == serial[0] and forked[2:] == serial[2:]
    # Counters compared as lists: the metrics are written in their order of first sight.
    assert [(k, list(c.items())) for k, c in forked[1].counts.items()] == \
        [(k, list(c.items())) for k, c in serial[1].counts.items()]
    assert forked[1].examples == serial[1].examples
    # And the rows are those of one chunk, in one process (provider codes renumbered right).
    whole = run(inputs, "whole.parquet", workers=1, chunk=1024)
    d = inputs[0]
    assert pq.read_table(d / "forked.parquet").equals(pq.read_table(d / "whole.parquet")) and whole[2] == serial[2]
    # The input is the mix it claims to be, over 10 chunks.
    counts = serial[1].counts
    assert serial[3] == 150 and set(counts["method"]) == {"truth", "logprobs", "text"}
    assert set(counts["match"]) >= {"exact", "semantic", "unknown"}
    assert {"response_failed:http_500", "prompt_missing", "truth_ids_outside_vocabulary", "billing_mismatch"} <= \
        set(counts["quarantine"])
    assert set(serial[2]["by_provider"]) == {p.lower() for p in PROVIDERS}


def test_an_error_in_a_worker_reaches_the_caller_as_itself_and_nothing_is_written(inputs, monkeypatch):
    from draftgate.reconstruct import table

    real = table.reconstruct

    def failing(rows, *a, **k):      # forked workers inherit the patch
        if any(r["prompt_id"] == "p000100" for r in rows):
            raise ReconstructError("chunk with p000100 refused")
        return real(rows, *a, **k)
    monkeypatch.setattr(table, "reconstruct", failing)
    d = inputs[0]
    with pytest.raises(ReconstructError, match="chunk with p000100 refused"):
        run(inputs, "out/failed.parquet", workers=2)
    assert not (d / "out").exists() or list((d / "out").iterdir()) == []


def test_a_worker_that_dies_fails_the_run_and_nothing_is_written(inputs, monkeypatch):
    import os
    from concurrent.futures.process import BrokenProcessPool

    from draftgate.reconstruct import table

    real = table.reconstruct
    monkeypatch.setattr(table, "reconstruct", lambda rows, *a, **k: os._exit(3) if len(rows) < 16
                        else real(rows, *a, **k))      # the last chunk, 6 rows
    with pytest.raises(BrokenProcessPool):
        run(inputs, "dead/failed.parquet", workers=2)
    assert not (inputs[0] / "dead").exists() or list((inputs[0] / "dead").iterdir()) == []


def test_workers_encode_on_one_thread_each_and_the_parent_keeps_its_choice(inputs):
    from draftgate.reconstruct import parallel
    from draftgate.tokenizers import ENCODE_THREADS

    with parallel.Pool(2, None) as pool:
        assert list(pool.imap(_threads_in_worker, [(4,), (4,)])) == [1, 1]
    assert ENCODE_THREADS.pinned is None


def _threads_in_worker(_state, cpus):
    import os

    from draftgate.tokenizers import ENCODE_THREADS

    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    return ENCODE_THREADS.pick(cpus)
