"""The client against the scripted server over real loopback HTTP: faults, stops, budget, pause, quirks."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from draftgate.client import Target, responses_table, run
from draftgate.client.journal import is_done, read_journal
from draftgate.client.request import Prompt
from draftgate.config import parse_params
from draftgate.serve.scripted import QUIRKS, RETRYABLE_FAULTS, Script, running

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
ODD_CALLS = ('[ {"id" : "add:0","type":"function", "function":{"name":"add",'
             '"arguments":"{ \\"b\\":2 ,\\"a\\" :  1}"}} ]')


# The client's cause code for each scripted fault whose name differs from it.
CAUSE_OF = {"reset": "connection", "content_parts_json": "content_parts_repr",
            "content_parts_python": "content_parts_repr", "http_429_provider": "http_429",
            "error_body_paid": "error_body", "http_502_paid": "http_502"}


def prompts(n: int, tools=None) -> list[Prompt]:
    return [Prompt(f"id{i:04d}", "tiny", [{"role": "user", "content": f"p{i:04d}"}], tools, 40) for i in range(n)]


def gen(**kw):
    # A deadline no loopback answer misses even on a loaded machine (load 5 on 2 cores: > 0.5 s seen).
    base = {"backend": "openai", "model": "scripted-model", "concurrency": 16, "timeout_s": 5.0,
            "retry_base_s": 0.005, "retry_max_s": 0.02, "retry_after_cap_s": 5.0}
    return parse_params({"generate": {**base, **kw}}).generate


def rows(table) -> dict[str, dict]:
    return {r["prompt_id"]: r for r in table.to_pylist()}


def test_fault_drill_every_prompt_ends_with_one_ok_row_or_one_final_failure(tmp_path):
    ps = prompts(1200)
    final = {"p0003": ("http_400",), "p0007": ("http_503", "http_403")}
    # The "timeout" fault stays silent until the client gives up. Every other answer must reach the
    # client inside its deadline for the counts below to be the script's: on a loaded 2-core machine
    # (load 5) loopback answers took over 0.5 s, and the client rightly journaled those as timeouts.
    script = Script(fault_rate=0.3, faults=RETRYABLE_FAULTS, seed=7, per_key=final, hang_s=60.0,
                    retry_after_s=0.01)
    journal = tmp_path / "journal.jsonl"
    with running(script) as server:
        result = run(ps, gen(concurrency=200, max_attempts=6), Target(server.base_url), journal, progress=False)
        actions, log = server.actions(), list(server.log)
        assert result.attempts == len(log)
    records = read_journal(journal).records
    # Attempt by attempt, each prompt's journaled causes are the server's own log of what it sent.
    sent = {}
    for a in sorted(log, key=lambda a: (a.key, a.attempt)):
        sent.setdefault("id" + a.key.removeprefix("p"), []).append(CAUSE_OF.get(a.action, a.action))
    for r in records:
        causes = [f["cause"] for f in r["failed_attempts"]]
        assert sent[r["prompt_id"]] == causes + (["ok"] if r["status"] == "ok" else []), r["prompt_id"]
    assert Counter(r["prompt_id"] for r in records) == Counter(p.prompt_id for p in ps)   # one line each
    table = responses_table(ps, result.hashes, records, result.stop_reason)
    assert table.num_rows == 1200 and len(set(table.column("prompt_id").to_pylist())) == 1200
    by_id = rows(table)
    assert by_id["id0003"]["failure_reason"] == "http_400" and by_id["id0003"]["attempts"] == 1
    assert by_id["id0007"]["failure_reason"] == "http_403" and by_id["id0007"]["attempts"] == 2
    assert result.ok + result.failed == 1200 and result.ok >= 1195
    for r in table.to_pylist():
        assert (r["status"], r["failure_reason"] is None) in (("ok", True), ("failed", False))
    # Every injected fault is accounted for: retried, or the final cause of an exhausted prompt.
    exhausted = Counter(r["failure_reason"] for r in records if r.get("failure_kind") == "exhausted")
    injected = Counter()
    for action in RETRYABLE_FAULTS:
        assert actions[action] > 5, action
        injected[CAUSE_OF.get(action, action)] += actions[action]
    for cause, n in injected.items():
        assert result.retries[cause] + exhausted[cause] == n, cause
    # ... and journaled, attempt by attempt, in its prompt's line.
    journaled = Counter(f["cause"] for r in records for f in r["failed_attempts"])
    assert all(journaled[cause] == n for cause, n in injected.items())
    assert sum(actions[a] for a in RETRYABLE_FAULTS) / sum(actions.values()) > 0.25


def test_tool_call_arguments_with_odd_spacing_survive_byte_exact_into_journal_and_table(tmp_path):
    body = ('\n{"id":"gen-odd","provider":"Odd","model":"m","choices":[{"index":0,"finish_reason":"tool_calls",'
            '"message":{"role":"assistant","content":null,"tool_calls":' + ODD_CALLS + '}}],'
            '"usage":{"prompt_tokens":3,"completion_tokens":9}}')
    ps = prompts(3, TOOLS)
    script = Script(replies={"p0001": body}, per_key={"p0001": ("keepalive_ws",)})
    with running(script) as server:
        result = run(ps, gen(), Target(server.base_url), tmp_path / "j.jsonl", progress=False)
    rec = next(r for r in read_journal(tmp_path / "j.jsonl").records if r["prompt_id"] == "id0001")
    assert rec["tool_calls"] == ODD_CALLS
    row = rows(responses_table(ps, result.hashes, [rec]))["id0001"]
    assert row["tool_calls"] == ODD_CALLS
    assert json.loads(row["tool_calls"])[0]["function"]["arguments"] == '{ "b":2 ,"a" :  1}'


def test_budget_stops_scheduling_before_spend_plus_in_flight_worst_case_would_pass_it(tmp_path):
    # Worst case per request: 100 completion tokens at $10/Mtok = $0.001 (prompt priced at 0).
    gp = gen(concurrency=4, max_tokens=100, budget_usd=0.0105,
             price={"prompt_usd_per_mtok": 0.0, "completion_usd_per_mtok": 10.0})
    ps = prompts(50)
    with running(Script(cost_usd=0.001, delay_s=(0.0, 0.02))) as server:
        result = run(ps, gp, Target(server.base_url), tmp_path / "j.jsonl", progress=False)
        assert server.requests == 10
    assert (result.stop_reason, result.exit_code) == ("budget", 0)
    assert result.ok == 10 and result.unsent == 40
    assert result.spent_usd == pytest.approx(0.010) and result.spent_usd <= 0.0105
    table = responses_table(ps, result.hashes, read_journal(tmp_path / "j.jsonl").records, result.stop_reason)
    assert Counter(table.column("failure_reason").to_pylist()) == {None: 10, "unsent_budget": 40}


def test_a_401_stops_the_run_cleanly_and_a_rerun_with_the_right_key_finishes_it(tmp_path):
    ps, journal = prompts(30), tmp_path / "j.jsonl"
    with running(Script(api_key="sk-or-v1-right")) as server:
        result = run(ps, gen(concurrency=4), Target(server.base_url, "sk-or-v1-wrong"), journal, progress=False)
        assert (result.stop_reason, result.exit_code) == ("auth_401", 1)
        assert server.requests <= 4            # never retried, nothing new scheduled
        stopped = read_journal(journal).records
        assert stopped and all(r["failure_kind"] == "stopped" and not is_done(r) for r in stopped)
        again = run(ps, gen(concurrency=4), Target(server.base_url, "sk-or-v1-right"), journal, progress=False)
    assert (again.stop_reason, again.ok, again.skipped) == (None, 30, 0)
    table = responses_table(ps, again.hashes, read_journal(journal).records)
    assert table.column("status").to_pylist() == ["ok"] * 30


def test_a_credits_402_stops_the_run_but_an_in_flight_budget_402_is_retried_after_retry_after(tmp_path):
    ps = prompts(20)
    with running(Script(per_key={"p0005": ("http_402_credits",)})) as server:
        result = run(ps, gen(concurrency=1), Target(server.base_url), tmp_path / "a.jsonl", progress=False)
    assert (result.stop_reason, result.exit_code, result.ok) == ("credits_402", 1, 5)
    assert result.unsent == 14
    script = Script(per_key={"p0002": ("http_402_inflight", "http_402_inflight")}, retry_after_s=0.3)
    with running(script) as server:
        result = run(ps, gen(concurrency=4), Target(server.base_url), tmp_path / "b.jsonl", progress=False)
        times = [a.t for a in server.log if a.key == "p0002"]
    assert (result.stop_reason, result.ok, result.retries["http_402_inflight"]) == (None, 20, 2)
    assert len(times) == 3 and all(b - a >= 0.29 for a, b in zip(times, times[1:]))


def test_a_burst_of_429s_pauses_every_sender_for_the_retry_after(tmp_path):
    # The first wave: 4 requests answered 429 (Retry-After 1 s) at once, 4 answered ok after 0.2 s.
    # Without a global pause those 4 workers would send the next prompts at ~0.2 s.
    per_key = {f"p{i:04d}": ("http_429",) for i in range(4)} | {f"p{i:04d}": ("slow",) for i in range(4, 8)}
    with running(Script(per_key=per_key, retry_after_s=1.0, slow_s=0.2)) as server:
        result = run(prompts(40), gen(concurrency=8), Target(server.base_url), tmp_path / "j.jsonl", progress=False)
        log = list(server.log)
    t0 = min(a.t for a in log)
    first_wave = {f"p{i:04d}" for i in range(8)}
    later = [a.t - t0 for a in log if a.key not in first_wave or a.attempt > 1]
    assert min(later) >= 0.95
    assert (result.ok, result.pauses_429, result.retries["http_429"]) == (40, 1, 4)


def test_provider_quirks_are_recorded_as_received(tmp_path):
    ps = prompts(2, TOOLS)
    with running(Script(quirks=QUIRKS)) as server:
        result = run(ps, gen(logprobs=True, top_logprobs=2), Target(server.base_url), tmp_path / "j.jsonl",
                     progress=False)
    row = rows(responses_table(ps, result.hashes, read_journal(tmp_path / "j.jsonl").records))["id0000"]
    assert row["content"] == "<think>Thinking about p0000.</think>Answer to p0000."
    assert row["reasoning"] is None and row["logprobs"] is None
    assert json.loads(row["tool_calls"])[0]["id"] == "add:0"
    assert row["model"] == "scripted-model-0127"


def test_a_rerun_skips_finished_prompts_and_a_changed_param_regenerates_them(tmp_path):
    ps, journal = prompts(20), tmp_path / "j.jsonl"
    with running(Script()) as server:
        first = run(ps, gen(), Target(server.base_url), journal, progress=False)
        second = run(ps, gen(), Target(server.base_url), journal, progress=False)
        assert server.requests == 20
        third = run(ps, gen(temperature=0.2), Target(server.base_url), journal, progress=False)
        assert server.requests == 40
    assert (first.sent, second.sent, second.skipped, third.sent) == (20, 0, 20, 20)
    table = responses_table(ps, third.hashes, read_journal(journal).records)
    assert table.num_rows == 20 and set(table.column("request_hash").to_pylist()) == set(third.hashes.values())


def test_local_backend_asks_for_token_ids_and_keeps_them_as_truth(tmp_path):
    ps = prompts(2)
    with running(Script()) as server:
        result = run(ps, gen(backend="local"), Target(server.base_url), tmp_path / "j.jsonl", progress=False)
    row = rows(responses_table(ps, result.hashes, read_journal(tmp_path / "j.jsonl").records))["id0001"]
    assert row["truth_ids"] == list(b"Answer to p0001.") + [2]


def journal_line(path, pid: str) -> dict:
    return next(r for r in read_journal(path).records if r["prompt_id"] == pid)


def test_a_leaked_error_in_content_is_journaled_as_received_then_retried(tmp_path):
    ps, journal = prompts(3), tmp_path / "j.jsonl"
    with running(Script(per_key={"p0001": ("leaked_error_body",)}, cost_usd=0.001)) as server:
        result = run(ps, gen(), Target(server.base_url), journal, progress=False)
    rec = journal_line(journal, "id0001")
    assert (rec["status"], rec["attempts"], rec["retry_causes"]) == ("ok", 2, ["leaked_error_body"])
    [junk] = rec["failed_attempts"]
    assert json.loads(junk["content"])["error"]["code"] == 502          # the paid answer, as received
    assert (junk["http_status"], junk["provider"], junk["cost_usd"]) == (200, "Scripted", 0.001)
    assert junk["usage"]["completion_tokens"] > 0 and junk["generation_id"].startswith("gen-")
    assert rec["content"] == "Answer to p0001." and rec["wasted_cost_usd"] == 0.001
    assert result.retries == {"leaked_error_body": 1}
    assert (result.wasted_usd, result.spent_usd) == (pytest.approx(0.001), pytest.approx(0.004))
    row = rows(responses_table(ps, result.hashes, read_journal(journal).records))["id0001"]
    assert (row["status"], row["cost_usd"], row["wasted_cost_usd"]) == ("ok", pytest.approx(0.002), 0.001)


def test_junk_on_every_attempt_ends_as_a_failed_row_with_its_reason_and_the_content(tmp_path):
    ps, journal = prompts(3), tmp_path / "j.jsonl"
    script = Script(per_key={"p0000": ("content_parts_json", "content_parts_python"),
                             "p0002": ("content_parts_python", "leaked_error_body")}, cost_usd=0.001)
    with running(script) as server:
        result = run(ps, gen(max_attempts=2), Target(server.base_url), journal, progress=False)
    rec = journal_line(journal, "id0000")
    assert (rec["status"], rec["failure_reason"], rec["failure_kind"]) == ("failed", "content_parts_repr", "exhausted")
    assert [f["content"] for f in rec["failed_attempts"]] == [
        '[{"type": "text", "text": "Answer to p0000."}]', "[{'type': 'text', 'text': 'Answer to p0000.'}]"]
    assert not is_done(rec)                                   # a rerun tries it again
    table = rows(responses_table(ps, result.hashes, read_journal(journal).records))
    assert [(table[p]["status"], table[p]["failure_reason"], table[p]["attempts"]) for p in ("id0000", "id0002")] == [
        ("failed", "content_parts_repr", 2), ("failed", "leaked_error_body", 2)]
    assert table["id0000"]["content"] == "[{'type': 'text', 'text': 'Answer to p0000.'}]"   # quarantined, shown
    assert table["id0000"]["provider"] == "Scripted" and table["id0000"]["billed_completion_tokens"] > 0
    assert table["id0000"]["cost_usd"] == table["id0000"]["wasted_cost_usd"] == pytest.approx(0.002)
    assert result.failures == {"content_parts_repr": 1, "leaked_error_body": 1}
    assert (result.wasted_usd, result.paid_failed_attempts) == (pytest.approx(0.004), 4)


def test_a_429_journals_the_provider_name_and_metadata_but_no_secret(tmp_path):
    key = "sk-or-v1-" + "5e" * 24
    meta = {"provider_name": "Fireworks", "raw": f"429 for key {key}: slow down", "is_byok": False,
            "request_headers": {"Authorization": f"Bearer {key}"}}
    script = Script(api_key=key, per_key={"p0000": ("http_429_provider",)}, error_metadata=meta, retry_after_s=0.01)
    journal = tmp_path / "j.jsonl"
    with running(script) as server:
        result = run(prompts(1), gen(), Target(server.base_url, key), journal, progress=False)
    [limited] = journal_line(journal, "id0000")["failed_attempts"]
    assert (limited["cause"], limited["http_status"], limited["provider"]) == ("http_429", 429, "Fireworks")
    assert limited["metadata"] == {"provider_name": "Fireworks", "raw": "429 for key [redacted]: slow down",
                                   "is_byok": False, "request_headers": {"Authorization": "[redacted]"}}
    assert "Fireworks" in limited["detail"]
    assert key.encode() not in journal.read_bytes() and key[-16:].encode() not in journal.read_bytes()
    assert result.failed_attempts_by_provider == {"Fireworks": 1} and result.ok == 1


def test_paid_errors_count_as_wasted_spend_and_in_the_tables_cost(tmp_path):
    ps, journal = prompts(4), tmp_path / "j.jsonl"
    script = Script(per_key={"p0000": ("error_body_paid",), "p0001": ("http_502_paid", "http_502_paid")},
                    cost_usd=0.001, retry_after_s=0.01)
    with running(script) as server:
        result = run(ps, gen(max_attempts=2), Target(server.base_url), journal, progress=False)
    paid = journal_line(journal, "id0000")["failed_attempts"][0]
    assert (paid["cause"], paid["http_status"], paid["cost_usd"]) == ("error_body", 200, 0.001)
    assert paid["usage"]["completion_tokens"] == 5 and paid["metadata"]["provider_name"] == "Scripted"
    failed = journal_line(journal, "id0001")
    assert (failed["failure_reason"], [f["http_status"] for f in failed["failed_attempts"]]) == ("http_502", [502, 502])
    # 3 ok answers + 3 paid errors at $0.001: half the spend bought nothing.
    assert (result.spent_usd, result.wasted_usd) == (pytest.approx(0.006), pytest.approx(0.003))
    assert result.paid_failed_attempts == 3
    table = responses_table(ps, result.hashes, read_journal(journal).records)
    assert sum(table.column("cost_usd").to_pylist()) == pytest.approx(result.spent_usd)
    assert sum(table.column("wasted_cost_usd").to_pylist()) == pytest.approx(result.wasted_usd)


# ---------------------------------------------------------------- budget over the journal, lost answers

# Worst case per request: 100 completion tokens at $10/Mtok = $0.001 (prompt priced at 0).
PRICED = {"max_tokens": 100, "price": {"prompt_usd_per_mtok": 0.0, "completion_usd_per_mtok": 10.0}}


def test_the_budget_bounds_the_whole_journal_across_reruns_not_each_run(tmp_path, capsys):
    ps, journal = prompts(20), tmp_path / "j.jsonl"
    with running(Script(cost_usd=0.001)) as server:
        first = run(ps, gen(concurrency=1, budget_usd=0.0025, **PRICED), Target(server.base_url), journal,
                    progress=False)
        second = run(ps, gen(concurrency=1, budget_usd=0.0025, **PRICED), Target(server.base_url), journal,
                     progress=False)
        third = run(ps, gen(concurrency=1, budget_usd=0.0025, **PRICED), Target(server.base_url), journal,
                    progress=False)
        assert server.requests == 2                         # per-run budgets would have bought 6
        raised = run(ps, gen(concurrency=1, budget_usd=0.0045, **PRICED), Target(server.base_url), journal,
                     progress=False)
        assert server.requests == 4
    assert (first.ok, second.sent, third.sent, raised.ok) == (2, 0, 0, 2)
    assert (first.spent_usd, second.spent_usd) == (pytest.approx(0.002), 0.0)
    assert second.spent_before_usd == pytest.approx(0.002) and raised.journal_spent_usd == pytest.approx(0.004)
    assert all(r.stop_reason == "budget" and r.exit_code == 0 for r in (first, second, third, raised))
    err = capsys.readouterr().err
    assert "budget $0.0025 for the whole journal: $0.0020 spent by earlier runs, $0.0005 left" in err
    # The stop says the total and the budget that would finish the job (18 prompts at $0.001).
    assert ("the journal has spent $0.0020 in total over every run ($0.0000 in this one) of "
            "generate.budget_usd $0.0025") in err
    assert "18 prompts are left, up to $0.0180 if each is answered once: to continue, set " \
           "generate.budget_usd to at least $0.0200" in err


def test_a_timed_out_or_dropped_answer_counts_as_wasted_at_its_worst_case(tmp_path):
    ps, journal = prompts(4), tmp_path / "j.jsonl"
    script = Script(per_key={"p0000": ("timeout",), "p0001": ("reset",), "p0002": ("malformed_json",)},
                    cost_usd=0.0005, hang_s=60.0, retry_after_s=0.01)
    with running(script) as server:
        result = run(ps, gen(timeout_s=2.0, budget_usd=1.0, **PRICED), Target(server.base_url), journal,
                     progress=False)
    assert result.ok == 4
    for pid, cause in (("id0000", "timeout"), ("id0001", "connection"), ("id0002", "malformed_json")):
        rec = journal_line(journal, pid)
        [lost] = rec["failed_attempts"]
        assert (lost["cause"], lost["worst_case_usd"]) == (cause, pytest.approx(0.001)), pid
        assert "cost_usd" not in lost and rec["wasted_cost_usd"] == pytest.approx(0.001)
    assert result.lost_attempts == 3 and result.paid_failed_attempts == 0
    assert result.wasted_usd == result.wasted_worst_case_usd == pytest.approx(0.003)
    assert result.spent_usd == pytest.approx(4 * 0.0005 + 0.003)
    table = responses_table(ps, result.hashes, read_journal(journal).records)
    assert sum(table.column("cost_usd").to_pylist()) == pytest.approx(result.spent_usd)


def test_a_refused_connection_sent_nothing_and_costs_nothing(tmp_path):
    import socket

    with socket.socket() as s:      # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run(prompts(1), gen(max_attempts=1, budget_usd=1.0, **PRICED), Target(f"http://127.0.0.1:{port}/v1"),
                 tmp_path / "j.jsonl", progress=False)
    [f] = journal_line(tmp_path / "j.jsonl", "id0000")["failed_attempts"]
    assert f["cause"] == "connect" and "worst_case_usd" not in f
    assert (result.wasted_usd, result.lost_attempts, result.failures) == (0.0, 0, {"connect": 1})


@pytest.mark.parametrize("params, message", [
    ({"budget_usd": 0.0, **PRICED}, "generate.budget_usd is 0 (no budget) but requests are paid"),
    ({"backend": "openrouter", "budget_usd": 5.0}, "generate.price is zero but backend openrouter bills"),
])
def test_a_paid_run_without_a_budget_or_price_sends_nothing(tmp_path, params, message):
    with running(Script()) as server:
        with pytest.raises(ValueError, match=re.escape(message)):
            run(prompts(3), gen(**params), Target(server.base_url), tmp_path / "j.jsonl", progress=False)
        assert server.requests == 0


def test_a_free_backend_runs_without_a_budget(tmp_path):
    with running(Script(cost_usd=0.0)) as server:
        result = run(prompts(3), gen(budget_usd=0.0), Target(server.base_url), tmp_path / "j.jsonl", progress=False)
    assert (result.ok, result.stop_reason) == (3, None)


def test_a_new_model_identity_regenerates_and_the_same_one_resumes(tmp_path):
    ps, journal = prompts(5), tmp_path / "j.jsonl"
    old = {"weights": "a" * 64, "tokenizer": "b" * 64, "chat_template": "c" * 64, "device": "cpu"}
    fixed = {**old, "tokenizer": "d" * 64}        # e.g. a fixed tokenizer conversion
    with running(Script()) as server:
        first = run(ps, gen(backend="local"), Target(server.base_url, identity=old), journal, progress=False)
        same = run(ps, gen(backend="local"), Target(server.base_url, identity=old), journal, progress=False)
        new = run(ps, gen(backend="local"), Target(server.base_url, identity=fixed), journal, progress=False)
        assert server.requests == 10
    assert (first.sent, same.skipped, new.sent) == (5, 5, 5)
    assert set(first.hashes.values()).isdisjoint(new.hashes.values())


# ---------------------------------------------------------------- the write-ahead budget

def journal_total(path) -> float:
    """What the journal has cost, as a rerun counts it: settled lines + unsettled reservations."""
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex

    return JournalIndex.scan(path, line_cost).spent_usd


def test_rising_budgets_across_reruns_under_faults_never_overshoot(tmp_path):
    # Lost answers (resets, unreadable 200s) count at their worst case ($0.001), paid errors and
    # answers at $0.0004: each rerun buys more, and the journal's total stays within each budget.
    faults = ("reset", "malformed_json", "http_502_paid", "error_body_paid", "http_429", "empty_output")
    script = Script(fault_rate=0.35, faults=faults, seed=3, cost_usd=0.0004, retry_after_s=0.01)
    ps, journal = prompts(40), tmp_path / "j.jsonl"
    totals = []
    with running(script) as server:
        for budget in (0.004, 0.008, 0.012):
            result = run(ps, gen(concurrency=4, budget_usd=budget, max_attempts=4, **PRICED),
                         Target(server.base_url), journal, progress=False)
            totals.append(journal_total(journal))
            assert result.stop_reason == "budget" and totals[-1] <= budget + 1e-12, (budget, totals)
            assert result.journal_spent_usd == pytest.approx(totals[-1])
    assert totals[0] < totals[1] < totals[2]
    assert read_journal(journal).unsettled == {}         # every reservation was settled by its line
    assert result.reservations > 0 and result.lost_attempts + result.paid_failed_attempts > 0


def test_a_retry_is_sent_only_when_the_budget_still_covers_its_worst_case(tmp_path, capsys):
    # The first attempt is lost (a reset: $0.001, its worst case); a retry would need $0.001 more.
    ps, journal = prompts(2), tmp_path / "j.jsonl"
    with running(Script(per_key={"p0000": ("reset",)}, cost_usd=0.0005)) as server:
        result = run(ps, gen(concurrency=1, budget_usd=0.0015, **PRICED), Target(server.base_url), journal,
                     progress=False)
        assert server.requests == 1                      # the retry was never sent
        rec = journal_line(journal, "id0000")
        assert (rec["status"], rec["failure_reason"], rec["failure_kind"]) == ("failed", "budget", "stopped")
        assert (result.stop_reason, result.refused_retries, result.unsent) == ("budget", 1, 1)
        assert journal_total(journal) == pytest.approx(0.001) and read_journal(journal).unsettled == {}
    # The stop counts what the prompt in progress held, the retry and the unsent prompt.
    assert "to continue, set generate.budget_usd to at least $0.0030" in capsys.readouterr().err
    with running(Script(cost_usd=0.0005)) as server:
        # A raised budget retries it (kind stopped is not done) and sends the other prompt.
        again = run(ps, gen(concurrency=1, budget_usd=0.004, **PRICED), Target(server.base_url), journal,
                    progress=False)
    assert (again.ok, again.stop_reason) == (2, None)
    assert journal_total(journal) == pytest.approx(0.001 + 2 * 0.0005)


def test_every_attempt_is_covered_by_reservations_journaled_before_it_is_sent(tmp_path):
    # p0001: a free 503 leaves its reservation unspent (the retry needs none), a lost reset spends it
    # all (the third attempt reserves anew), a paid error ($0.0004) leaves $0.0006 of it.
    per_key = {"p0001": ("http_503", "reset"), "p0002": ("http_502_paid",)}
    ps, journal = prompts(3), tmp_path / "j.jsonl"
    with running(Script(per_key=per_key, retry_after_s=0.01, cost_usd=0.0004)) as server:
        run(ps, gen(budget_usd=1.0, **PRICED), Target(server.base_url), journal, progress=False)
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    for pid, attempts, amounts in (("id0000", [1], [0.001]), ("id0001", [1, 3], [0.001, 0.001]),
                                   ("id0002", [1, 2], [0.001, 0.0004])):
        reserved = [x for x in lines if x["prompt_id"] == pid and x["status"] == "reserved"]
        [done] = [x for x in lines if x["prompt_id"] == pid and x["status"] != "reserved"]
        assert [x["attempt"] for x in reserved] == attempts
        assert [x["worst_case_usd"] for x in reserved] == pytest.approx(amounts)
        assert done["reservations"] == [x["reservation"] for x in reserved]   # it settles exactly those
        assert lines.index(done) > max(lines.index(x) for x in reserved)
    assert read_journal(journal).unsettled == {}


def test_a_free_backend_writes_no_reservation_lines_even_when_a_server_reports_costs(tmp_path):
    # A zero price means a zero worst case: a retry after a (reportedly) paid error reserves nothing.
    script = Script(cost_usd=0.0001, per_key={"p0001": ("http_502_paid",)}, retry_after_s=0.01)
    with running(script) as server:
        result = run(prompts(3), gen(budget_usd=0.0), Target(server.base_url), tmp_path / "j.jsonl",
                     progress=False)
    assert result.ok == 3 and result.retries == {"http_502": 1}
    assert read_journal(tmp_path / "j.jsonl").reservations == 0


def test_the_secrets_of_a_target_are_its_key_its_credential_headers_and_the_extra_ones():
    t = Target("https://api.example/v1", "sk-key-1234567890", {"X-Title": "draftgate", "X-Api-Key": "hdr-secret-99"},
               extra_secrets=("env-secret-42", "sk-key-1234567890"))
    assert set(t.secrets) == {"sk-key-1234567890", "hdr-secret-99", "env-secret-42"}
    assert "sk-key" not in repr(t) and "env-secret" not in repr(t)
