"""The journal: durable appends, torn-line tolerance, the resume rule and the one-row-per-prompt rule."""

from __future__ import annotations

import asyncio
import json
import os

from draftgate.client.journal import Journal, is_done, latest, read_journal


def line(pid: str, status: str = "ok", h: str = "h", **kw) -> dict:
    return {"prompt_id": pid, "request_hash": h, "status": status, **kw}


async def append_all(path, records):
    async with Journal(path) as j:
        await asyncio.gather(*(j.append(r) for r in records))
        return j.commits


def test_appends_are_grouped_into_few_fsynced_commits(tmp_path):
    path = tmp_path / "journal.jsonl"
    commits = asyncio.run(append_all(path, [line(f"p{i}") for i in range(500)]))
    scan = read_journal(path)
    assert [r["prompt_id"] for r in scan.records] == [f"p{i}" for i in range(500)]
    assert commits < 50   # 500 concurrent appends share commits instead of 500 fsyncs


def test_a_torn_last_line_is_ignored_counted_and_isolated_from_the_next_append(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(json.dumps(line("a")).encode() + b"\n" + b'{"prompt_id": "b", "sta')
    scan = read_journal(path)
    assert scan.torn_tail and [r["prompt_id"] for r in scan.records] == ["a"]
    asyncio.run(append_all(path, [line("c")]))
    scan = read_journal(path)
    assert not scan.torn_tail
    assert scan.bad_lines == [2]                      # the old fragment, now on its own line
    assert [r["prompt_id"] for r in scan.records] == ["a", "c"]


def test_a_tail_that_lost_only_its_newline_is_a_whole_record(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(json.dumps(line("a")).encode())
    scan = read_journal(path)
    assert not scan.torn_tail and [r["prompt_id"] for r in scan.records] == ["a"]


def test_last_ok_line_wins_else_last_failure_and_other_hashes_are_ignored():
    records = [
        line("a", "failed", failure_kind="exhausted", failure_reason="timeout"),
        line("a", "ok", content="first"),
        line("a", "ok", content="second"),
        line("a", "failed", failure_kind="exhausted", failure_reason="http_503"),
        line("b", "failed", failure_kind="exhausted", failure_reason="timeout"),
        line("b", "failed", failure_kind="permanent", failure_reason="http_400"),
        line("c", "ok", h="old-params"),
    ]
    chosen = latest(records, {"a": "h", "b": "h", "c": "h"})
    assert chosen["a"]["content"] == "second"
    assert chosen["b"]["failure_reason"] == "http_400"
    assert "c" not in chosen


def test_resume_skips_ok_and_permanent_failures_but_retries_exhausted_and_stopped():
    assert is_done(line("a", "ok"))
    assert is_done(line("a", "failed", failure_kind="permanent"))
    assert not is_done(line("a", "failed", failure_kind="exhausted"))
    assert not is_done(line("a", "failed", failure_kind="stopped"))


def test_a_missing_journal_is_an_empty_one(tmp_path):
    scan = read_journal(tmp_path / "none.jsonl")
    assert scan.records == [] and not scan.torn_tail and scan.bad_lines == []


def test_a_failed_write_reaches_every_waiter_with_the_path_and_the_fix(tmp_path):
    path = tmp_path / "journal.jsonl"

    async def go():
        async with Journal(path) as j:
            os.close(j._fd)          # the disk goes away under the writer
            j._fd = os.open(os.devnull, os.O_RDONLY)
            results = await asyncio.gather(*(j.append(line(f"p{i}")) for i in range(3)), return_exceptions=True)
        return results

    results = asyncio.run(go())
    assert len(results) == 3 and all(isinstance(r, OSError) for r in results)
    assert str(path) in str(results[0]) and "rerun" in str(results[0])


def test_a_lone_surrogate_from_a_provider_is_journaled_losslessly_and_tabled_as_invalid_unicode(tmp_path):
    import pyarrow.parquet as pq

    from draftgate.client.request import Prompt
    from draftgate.client.table import responses_table
    from draftgate.io import write_parquet

    # Valid JSON from the wire, but not valid UTF-8 text once decoded.
    bad = json.loads('"half a pair: \\ud83d"')
    path = tmp_path / "journal.jsonl"
    asyncio.run(append_all(path, [line("a", content=bad, usage={"completion_tokens": 3}),
                                  line("b", content="fine", usage={"completion_tokens": 1})]))
    records = read_journal(path).records
    assert records[0]["content"] == bad

    prompts = [Prompt(pid, "chat", [{"role": "user", "content": "hi"}], None, 2) for pid in ("a", "b")]
    table = responses_table(prompts, {"a": "h", "b": "h"}, records)
    write_parquet(tmp_path / "responses.parquet", table)
    rows = pq.read_table(tmp_path / "responses.parquet").to_pylist()
    assert [(r["status"], r["failure_reason"], r["content"]) for r in rows] == [
        ("failed", "invalid_unicode", None), ("ok", None, "fine")]


def test_a_quarantined_junk_answer_with_a_lone_surrogate_keeps_its_reason_in_the_table(tmp_path):
    from draftgate.client.request import Prompt
    from draftgate.client.table import responses_table
    from draftgate.io import write_parquet

    bad = json.loads('"{\\"error\\": {\\"message\\": \\"\\ud83d\\"}}"')
    rec = line("a", "failed", failure_reason="leaked_error_body", failure_kind="exhausted", wasted_cost_usd=0.002,
               failed_attempts=[{"cause": "leaked_error_body", "content": bad, "usage": {"completion_tokens": 3}}])
    table = responses_table([Prompt("a", "chat", [{"role": "user", "content": "hi"}], None, 2)], {"a": "h"}, [rec])
    write_parquet(tmp_path / "responses.parquet", table)
    [row] = table.to_pylist()
    assert (row["status"], row["failure_reason"], row["content"]) == ("failed", "leaked_error_body", None)
    assert (row["billed_completion_tokens"], row["cost_usd"]) == (3, 0.002)


def _same_index(a, b) -> None:
    import numpy as np

    assert (a.records, a.bad_lines, a.torn_tail, a.spent_usd) == (b.records, b.bad_lines, b.torn_tail, b.spent_usd)
    assert (a.complete_bytes, a.complete_lines, a.complete_sha256) == (b.complete_bytes, b.complete_lines,
                                                                      b.complete_sha256)
    for name, _ in a.COLUMNS:
        assert np.array_equal(a._cols[name], b._cols[name]), name


def test_a_cached_scan_reads_only_the_lines_appended_since_and_equals_a_full_scan(tmp_path, monkeypatch):
    import hashlib

    from draftgate.client import journal as journal_mod
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex

    path, cache = tmp_path / "journal.jsonl", tmp_path / "journal.jsonl.index"
    asyncio.run(append_all(path, [line(f"p{i}", cost_usd=0.5) for i in range(30)]))
    with open(path, "ab") as f:
        f.write(b'{"torn\n')                                       # a bad line, terminated
    asyncio.run(append_all(path, [line("p3", "failed", failure_kind="permanent")]))
    JournalIndex.scan(path, line_cost, cache=cache)
    asyncio.run(append_all(path, [line(f"q{i}", cost_usd=0.25) for i in range(5)]))
    with open(path, "ab") as f:
        f.write(json.dumps(line("r")).encode())                   # a tail that lost its newline

    parsed = []
    real = journal_mod._parse
    monkeypatch.setattr(journal_mod, "_parse", lambda b: parsed.append(b) or real(b))
    cached = JournalIndex.scan(path, line_cost, cache=cache)
    assert len(parsed) == 6                                       # 5 appended lines and the tail
    monkeypatch.setattr(journal_mod, "_parse", real)
    _same_index(cached, JournalIndex.scan(path, line_cost))
    assert cached.spent_usd == 30 * 0.5 + 5 * 0.25 and cached.bad_lines == [31]
    assert cached.done("r", "h") and cached.done("p3", "h")
    whole = path.read_bytes()[:cached.complete_bytes]
    assert cached.complete_sha256 == hashlib.sha256(whole).hexdigest()

    # The tail is terminated by the next append: the cache, which never took it, still fits.
    asyncio.run(append_all(path, [line("s")]))
    _same_index(JournalIndex.scan(path, line_cost, cache=cache), JournalIndex.scan(path, line_cost))


def test_a_cache_of_other_bytes_is_ignored_and_replaced(tmp_path):
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex

    path, cache = tmp_path / "journal.jsonl", tmp_path / "journal.jsonl.index"
    asyncio.run(append_all(path, [line(f"p{i}") for i in range(10)]))
    JournalIndex.scan(path, line_cost, cache=cache)
    # Rewritten, not appended to (a restored backup, an edit): the same size, other bytes.
    path.write_bytes(path.read_bytes().replace(b'"p1"', b'"x1"'))
    again = JournalIndex.scan(path, line_cost, cache=cache)
    _same_index(again, JournalIndex.scan(path, line_cost))
    assert again.done("x1", "h") and not again.done("p1", "h")
    cache.write_bytes(b"garbage")
    _same_index(JournalIndex.scan(path, line_cost, cache=cache), again)


def test_a_cached_scan_made_by_other_code_is_not_used(tmp_path):
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex

    path, cache = tmp_path / "journal.jsonl", tmp_path / "journal.jsonl.index"
    asyncio.run(append_all(path, [line(f"p{i}", cost_usd=0.5) for i in range(10)]))
    assert JournalIndex.scan(path, line_cost, cache=cache).spent_usd == 5.0
    # Another cost rule (another module's code): the cached costs must not stand in for it.
    assert JournalIndex.scan(path, _flat_cost, cache=cache).spent_usd == 10 * 0.125
    assert JournalIndex.scan(path, line_cost, cache=cache).spent_usd == 5.0


def _flat_cost(rec: dict) -> float:
    return 0.125


# ---------------------------------------------------------------- write-ahead reservations

def reserve(pid: str, rid: str, worst: float = 0.001) -> dict:
    return line(pid, "reserved", reservation=rid, attempt=1, worst_case_usd=worst)


def test_an_unsettled_reservation_counts_at_its_worst_case_and_a_finished_line_settles_its_own(tmp_path):
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex

    path = tmp_path / "journal.jsonl"
    asyncio.run(append_all(path, [reserve("a", "r1"), reserve("a", "r2"), reserve("b", "r3"),
                                  line("a", cost_usd=0.0004, wasted_cost_usd=0.001, reservations=["r1", "r2"])]))
    scan = read_journal(path)
    # Reservation lines are neither records nor bad lines; r3 (b's request, sent, never answered) stays open.
    assert [r["prompt_id"] for r in scan.records] == ["a"] and not scan.bad_lines
    assert (scan.reservations, scan.unsettled) == (3, {"r3": 0.001})
    index = JournalIndex.scan(path, line_cost)
    assert index.spent_usd == 0.0004 + 0.001 + 0.001 and index.unsettled == {"r3": 0.001}
    assert index.done("a", "h") and not index.done("b", "h")      # b is sent again by a rerun


def test_a_cached_scan_keeps_the_open_reservations_and_not_those_of_a_tail_without_its_newline(tmp_path):
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex

    path, cache = tmp_path / "journal.jsonl", tmp_path / "journal.jsonl.index"
    asyncio.run(append_all(path, [reserve("a", "r1"), reserve("b", "r2"), reserve("c", "r3")]))
    with open(path, "ab") as f:   # a's settlement lost its newline: read again next time, never cached
        f.write(json.dumps(line("a", cost_usd=0.0002, reservations=["r1"])).encode())
    first = JournalIndex.scan(path, line_cost, cache=cache)
    assert first.unsettled == {"r2": 0.001, "r3": 0.001}
    asyncio.run(append_all(path, [line("b", cost_usd=0.0003, reservations=["r2"]), reserve("d", "r4")]))
    cached, full = JournalIndex.scan(path, line_cost, cache=cache), JournalIndex.scan(path, line_cost)
    _same_index(cached, full)
    assert cached.unsettled == full.unsettled == {"r3": 0.001, "r4": 0.001}
    assert cached.spent_usd == full.spent_usd == 0.0002 + 0.0003 + 0.002


def test_the_writer_redacts_a_secret_any_field_still_holds_and_names_the_field(tmp_path):
    key = "sk-or-v1-" + "7f" * 24
    path = tmp_path / "journal.jsonl"

    async def write() -> int:
        async with Journal(path, (key,)) as j:
            await j.append(line("a", content="fine", usage={"note": f"billed to {key}"}))
            await j.append(line("b", content="untouched"))
            return j.redacted_lines

    assert asyncio.run(write()) == 1
    assert key.encode() not in path.read_bytes()
    a, b = read_journal(path).records
    assert a["usage"] == {"note": "billed to [redacted]"} and a["redacted"] == ["usage"] and a["content"] == "fine"
    assert "redacted" not in b
