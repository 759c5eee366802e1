"""Generate in bounded memory: prompts streamed from prompts.parquet, the journal indexed, not
loaded, and the table written batch by batch, equal to the in-memory path."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from draftgate import schema
from draftgate.client import Target, responses_table, run
from draftgate.client.budget import line_cost
from draftgate.client.journal import JournalIndex, encode_line, latest, read_journal
from draftgate.client.request import build_body, request_hash
from draftgate.client.table import PromptFile, read_prompts, write_responses
from draftgate.serve.scripted import RETRYABLE_FAULTS, Script, running
from test_client_run import gen


def prompts_file(path, n):
    rows = [{"prompt_id": f"id{i:04d}", "dataset": "tiny", "split": "train", "source": f"t:{i}", "n_duplicates": 0,
             "messages": json.dumps([{"role": "user", "content": f"p{i:04d}"}]), "tools": None} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.prompts()), path)


def test_a_streamed_run_and_table_equal_the_in_memory_ones_and_resume_the_same(tmp_path):
    prompts_file(tmp_path / "prompts.parquet", 300)
    params = gen(concurrency=32, max_attempts=3, limit=250)
    source = PromptFile(tmp_path / "prompts.parquet", params.limit, batch=64)
    listed = read_prompts(str(tmp_path / "prompts.parquet"))
    script = Script(fault_rate=0.2, faults=RETRYABLE_FAULTS, seed=3, retry_after_s=0.01, hang_s=1.0)
    journal = tmp_path / "journal.jsonl"
    with running(script) as server:
        target = Target(server.base_url)
        first = run(source, params, target, journal, progress=False)
        again = run(source, params, target, journal, progress=False)
    assert (first.total, len(source)) == (250, 250) and first.ok + first.failed == first.sent
    # Every ok (and permanent failure) is done; what ran out of retries is sent again.
    assert again.skipped >= first.ok and again.sent == 250 - again.skipped

    def hash_of(p):
        return request_hash(build_body(p, params), params.backend, target.identity)
    stats = write_responses(tmp_path / "responses.parquet", source, hash_of, journal, batch=50)
    streamed = pq.read_table(tmp_path / "responses.parquet")
    hashes = {p.prompt_id: hash_of(p) for p in listed[:250]}
    whole = responses_table(listed[:250], hashes, read_journal(journal).records)
    assert streamed.equals(whole)
    assert (stats.rows, stats.ok) == (250, whole.column("status").to_pylist().count("ok"))
    # The run's own hashes (32 bytes a prompt, prompt order) give the same table without rehashing.
    assert len(again.hash_bytes) == 32 * 250
    write_responses(tmp_path / "again.parquet", source, None, journal, hashes=again.hash_bytes)
    assert pq.read_table(tmp_path / "again.parquet").equals(whole)


def test_a_no_op_resume_hands_its_journal_index_to_the_table(tmp_path):
    prompts_file(tmp_path / "prompts.parquet", 20)
    source = PromptFile(tmp_path / "prompts.parquet")
    with running(Script()) as server:
        first = run(source, gen(), Target(server.base_url), tmp_path / "j.jsonl", progress=False)
        again = run(source, gen(), Target(server.base_url), tmp_path / "j.jsonl", progress=False)
    assert first.index is None and first.ok == 20          # lines were appended: the table rescans
    assert again.sent == 0 and again.index is not None and again.index.records == 20


def test_the_journal_index_picks_the_same_line_as_the_table_rule_and_sums_the_spend(tmp_path):
    path = tmp_path / "j.jsonl"
    lines = [
        {"prompt_id": "a", "request_hash": "h1", "status": "failed", "failure_kind": "exhausted", "wasted_cost_usd": 0.25},
        {"prompt_id": "b", "request_hash": "h1", "status": "failed", "failure_kind": "permanent"},
        {"prompt_id": "a", "request_hash": "h1", "status": "ok", "cost_usd": 1.0},
        {"prompt_id": "a", "request_hash": "h0", "status": "ok", "cost_usd": 2.0},   # an old request: not chosen
        {"prompt_id": "c", "request_hash": "h1", "status": "failed", "failure_kind": "exhausted"},
    ]
    path.write_bytes(b"".join(encode_line(r) for r in lines) + b"not json\n" + b'{"prompt_id": "d", "sta')
    index = JournalIndex.scan(path, line_cost)
    scan = read_journal(path)
    chosen = latest(scan.records, {"a": "h1", "b": "h1", "c": "h1"})
    with open(path, "rb") as f:
        for pid in "abc":
            assert JournalIndex.read(f, index.chosen(pid, "h1")) == chosen[pid]
    assert (index.done("a", "h1"), index.done("b", "h1"), index.done("c", "h1"), index.done("a", "h9")) == \
        (True, True, False, False)
    assert index.spent_usd == 3.25 and index.records == len(scan.records) == 5
    assert (index.bad_lines, index.torn_tail) == (scan.bad_lines, scan.torn_tail) == ([6], True)


def test_a_batch_lookup_applies_the_table_rule_to_every_prompt_at_once(tmp_path):
    import random

    import numpy as np

    from draftgate.client.journal import digest64, hash64, hash64_array

    rng = random.Random(7)
    hashes = ["%064x" % rng.getrandbits(256) for _ in range(3)]
    lines = [{"prompt_id": f"p{rng.randrange(40)}", "request_hash": rng.choice(hashes),
              "status": rng.choice(["ok", "failed"]), "failure_kind": rng.choice(["permanent", "exhausted"]),
              "n": i} for i in range(300)]
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"".join(encode_line(r) for r in lines))
    index = JournalIndex.scan(path)
    current = {f"p{i}": rng.choice(hashes) for i in range(45)}     # p40..p44: never asked
    chosen = latest(read_journal(path).records, current)

    pids = list(current)
    at = index.lookup([digest64(p) for p in pids], hash64_array(b"".join(bytes.fromhex(current[p]) for p in pids)))
    assert at.tolist() == index.lookup([digest64(p) for p in pids], [hash64(current[p]) for p in pids]).tolist()
    with open(path, "rb") as f:
        got = {p: JournalIndex.read(f, w) for p, w in zip(pids, index.where(at)) if w}
    assert got == chosen and len(got) > 20
    done = index.is_done(at)
    assert [bool(d) for d in done] == [p in chosen and (chosen[p]["status"] == "ok" or chosen[p]["failure_kind"] ==
                                                        "permanent") for p in pids]
    assert isinstance(done, np.ndarray)


def test_the_table_rows_fields_are_the_responses_schemas_columns_in_order():
    from draftgate import schema
    from draftgate.client.table import FIELDS, _unsent

    assert list(FIELDS) == schema.responses().names
    assert len(_unsent("p", "d", "h", None)) == len(FIELDS)
