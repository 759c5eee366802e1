"""The generate stage end to end against the scripted server: crash/resume, secrets, stops, the gate."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from draftgate import schema
from draftgate.client.journal import read_journal
from draftgate.serve.scripted import RETRYABLE_FAULTS, Script, running
from stages import generate

REPO = Path(__file__).resolve().parents[1]
# OpenRouter bills: its params need a price and a budget (client/budget.py).
PAID = {"budget_usd": 10.0, "price": {"prompt_usd_per_mtok": 1.0, "completion_usd_per_mtok": 2.0}}


def workspace(tmp: Path, n: int, gate_ok: bool = True, **generate_params) -> dict[str, str]:
    rows = [{"prompt_id": f"id{i:04d}", "dataset": "tiny", "split": "train", "source": f"tiny.jsonl:{i + 1}",
             "messages": json.dumps([{"role": "user", "content": f"p{i:04d}"}]), "tools": None,
             "n_duplicates": 0} for i in range(n)]
    (tmp / "prompts").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.prompts()), tmp / "prompts" / "prompts.parquet")
    (tmp / "gate.json").write_text(json.dumps({"success": gate_ok}))
    gp = {"backend": "openai", "model": "m", "concurrency": 16, "timeout_s": 0.5,
          "retry_base_s": 0.005, "retry_max_s": 0.02, **generate_params}
    (tmp / "params.yaml").write_text(yaml.safe_dump({"generate": gp}))
    return {"params": str(tmp / "params.yaml"), "prompts": str(tmp / "prompts" / "prompts.parquet"),
            "gate": str(tmp / "gate.json"), "out": str(tmp / "responses"), "metrics": str(tmp / "metrics.json")}


def details(paths: dict[str, str]) -> dict:
    """Everything the stage recorded, text included (the metric beside it holds the numbers)."""
    return json.loads(Path(paths["metrics"]).with_name("metrics.details.json").read_text())


def argv(paths: dict[str, str]) -> list[str]:
    return [x for k in ("params", "prompts", "gate", "out", "metrics") for x in (f"--{k}", paths[k])]


def kill_generate_once(paths: dict, journal: Path, enough) -> None:
    """Run the stage in its own process and SIGKILL it once `enough(journal bytes)` holds."""
    proc = subprocess.Popen([sys.executable, "-m", "stages.generate", *argv(paths)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and enough(journal.read_bytes()):
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_sigkill_mid_run_then_rerun_loses_nothing_duplicates_nothing_and_tolerates_a_torn_line(tmp_path):
    script = Script(fault_rate=0.1, faults=tuple(f for f in RETRYABLE_FAULTS if f != "timeout"),
                    delay_s=(0.02, 0.08), retry_after_s=0.01)
    with running(script) as server:
        paths = workspace(tmp_path, 400, base_url=server.base_url)
        journal = Path(paths["out"]) / "journal.jsonl"
        kill_generate_once(paths, journal, lambda data: data.count(b"\n") >= 80)
        before = read_journal(journal).records
        assert 80 <= len(before) < 400, "the kill must land mid-run"
        with open(journal, "ab") as f:                # a crash mid-write leaves a partial line
            f.write(b'{"prompt_id": "id0399", "status": "o')
        assert generate.main(argv(paths)) == 0
        answered = Counter(a.key for a in server.log if a.action in ("ok", "keepalive_ws", "slow"))
    after = read_journal(journal)
    ok_lines = Counter(r["prompt_id"] for r in after.records if r["status"] == "ok")
    assert after.bad_lines and not after.torn_tail
    assert after.records[:len(before)] == before       # nothing rewritten
    table = pq.read_table(Path(paths["out"]) / "responses.parquet")
    assert table.schema == schema.responses()
    assert sorted(table.column("prompt_id").to_pylist()) == [f"id{i:04d}" for i in range(400)]
    assert set(table.column("status").to_pylist()) == {"ok"}
    assert max(ok_lines.values()) == 1                  # the rerun re-sent none that was journaled
    resent = sum(1 for n in answered.values() if n > 1)
    assert resent <= 16                                 # at most what was in flight at the kill
    metrics = json.loads(Path(paths["metrics"]).read_text())
    assert metrics["journal_torn_tail"] is True and metrics["skipped_done"] == len({r["prompt_id"] for r in before})


def test_the_api_key_never_appears_in_any_file_or_log_the_run_wrote(tmp_path, monkeypatch, capfd):
    key = "sk-or-v1-" + secrets.token_hex(32)
    monkeypatch.setenv("DRAFTGATE_TEST_KEY", key)
    with running(Script(api_key=key, fault_rate=0.3, hang_s=1.0, retry_after_s=0.01)) as server:
        paths = workspace(tmp_path, 60, backend="openrouter", base_url=server.base_url,
                          api_key_env="DRAFTGATE_TEST_KEY", http_referer="https://example.org", **PAID)
        assert generate.main(argv(paths)) == 0
        assert all(a.action != "http_401" for a in server.log)   # the key was sent on every request
    out, err = capfd.readouterr()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) >= 5
    for p in files:
        assert key.encode() not in p.read_bytes(), p
        assert key[-16:].encode() not in p.read_bytes(), p
    assert key not in out + err


def test_a_401_exits_non_zero_with_a_clear_message_and_writes_journal_table_and_metrics(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTGATE_TEST_KEY", "sk-or-v1-wrong")
    with running(Script(api_key="sk-or-v1-right")) as server:
        paths = workspace(tmp_path, 10, backend="openrouter", base_url=server.base_url,
                          api_key_env="DRAFTGATE_TEST_KEY", concurrency=2, **PAID)
        assert generate.main(argv(paths)) == 1
    assert "auth_401" in capsys.readouterr().err
    assert details(paths)["stop_reason"] == "auth_401"
    assert json.loads(Path(paths["metrics"]).read_text())["rows_out"] == 0
    table = pq.read_table(Path(paths["out"]) / "responses.parquet")
    assert Counter(table.column("failure_reason").to_pylist()) == {"auth_401": 2, "unsent_auth_401": 8}


def test_refuses_to_run_when_the_prompts_gate_failed(tmp_path, capsys):
    with running(Script()) as server:
        paths = workspace(tmp_path, 3, gate_ok=False, base_url=server.base_url)
        assert generate.main(argv(paths)) == 2
        assert server.requests == 0
    assert "gate_prompts did not pass" in capsys.readouterr().err


def test_openrouter_without_the_key_variable_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DRAFTGATE_UNSET_KEY", raising=False)
    paths = workspace(tmp_path, 3, backend="openrouter", api_key_env="DRAFTGATE_UNSET_KEY")
    assert generate.main(argv(paths)) == 2
    assert "DRAFTGATE_UNSET_KEY is not set" in capsys.readouterr().err


def test_metrics_report_truncations_retries_providers_and_rates(tmp_path):
    long = ('{"id":"g","provider":"Prov","model":"m","choices":[{"finish_reason":"length",'
            '"message":{"content":"cut"}}],"usage":{"prompt_tokens":2,"completion_tokens":128,"cost":0.5}}')
    script = Script(replies={"p0000": long, "p0001": long}, per_key={"p0002": ("http_503", "reset")},
                    retry_after_s=0.01)
    with running(script) as server:
        paths = workspace(tmp_path, 5, base_url=server.base_url)
        assert generate.main(argv(paths)) == 0
    m = json.loads(Path(paths["metrics"]).read_text())
    assert m["truncated_length"] == 2 and m["finish_reasons"] == {"length": 2, "stop": 3}
    assert m["retries_by_cause"] == {"connection": 1, "http_503": 1}
    assert m["providers"] == {"Prov": 2, "Scripted": 3}
    assert m["spent_usd"] == pytest.approx(1.0 + 3 * 0.0001)
    assert m["rows_in"] == m["rows_out"] == 5 and "requests_per_s" not in m      # the run's pace: details only
    assert details(paths)["requests_per_s"] > 0
    assert details(paths)["params"]["backend"] == "openai"


def test_backend_local_starts_the_local_server_and_keeps_its_token_ids_as_truth(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    paths = workspace(tmp_path, 2, backend="local", model="smollm2-135m-instruct", max_tokens=6, concurrency=2,
                      timeout_s=120.0)
    assert generate.main(argv(paths)) == 0
    rows = pq.read_table(Path(paths["out"]) / "responses.parquet").to_pylist()
    assert [r["status"] for r in rows] == ["ok", "ok"]
    for r in rows:
        assert r["truth_ids"] and len(r["truth_ids"]) == r["billed_completion_tokens"] <= 6
        assert r["content"] and r["provider"] == "local"
    # The hash names the served weights and tokenizer; a second server start serves the same: resumed.
    assert generate.main(argv(paths)) == 0
    assert json.loads(Path(paths["metrics"]).read_text())["skipped_done"] == 2
    from draftgate.client.request import build_body, prompt_from_row, request_hash
    from draftgate.config import load_params
    from draftgate.serve.process import running as serving, served_identity

    gp = load_params(paths["params"]).generate
    with serving(load_params(paths["params"]).serve) as url:
        identity = served_identity(url)
    prompt = prompt_from_row(pq.read_table(paths["prompts"]).to_pylist()[0], "row 0")
    assert rows[0]["request_hash"] == request_hash(build_body(prompt, gp), "local", identity)
    assert rows[0]["request_hash"] != request_hash(build_body(prompt, gp), "local")


def test_a_key_is_never_sent_over_plain_http_to_another_host(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTGATE_TEST_KEY", "sk-or-v1-secret")
    paths = workspace(tmp_path, 1, backend="openrouter", base_url="http://203.0.113.9/v1",
                      api_key_env="DRAFTGATE_TEST_KEY")
    assert generate.main(argv(paths)) == 2
    err = capsys.readouterr().err
    assert "would travel unencrypted" in err and "sk-or-v1-secret" not in err


def test_metrics_count_paid_errors_and_junk_answers_as_wasted_spend_and_quarantine_junk(tmp_path):
    script = Script(per_key={"p0000": ("error_body_paid",), "p0001": ("leaked_error_body", "content_parts_python"),
                             "p0002": ("http_429_provider",)},
                    error_metadata={"provider_name": "Fireworks"}, cost_usd=0.01, retry_after_s=0.01)
    with running(script) as server:
        paths = workspace(tmp_path, 4, base_url=server.base_url, max_attempts=2)
        assert generate.main(argv(paths)) == 0
    m = json.loads(Path(paths["metrics"]).read_text())
    # Paid: 3 ok answers, 1 billed error body, 2 junk answers; the 429 was free.
    assert m["spent_usd"] == pytest.approx(0.06) and m["wasted_usd"] == pytest.approx(0.03)
    assert m["table_cost_usd"] == pytest.approx(0.06) and m["paid_failed_attempts"] == 3
    assert m["failed_attempts_by_provider"] == {"Fireworks": 2, "Scripted": 2}
    assert m["retries_by_cause"] == {"error_body": 1, "http_429": 1, "leaked_error_body": 1}
    assert m["rows_out"] == 3 and m["drops_by_reason"] == {"content_parts_repr": 1}
    row = pq.read_table(Path(paths["out"]) / "responses.parquet").to_pylist()[1]
    assert (row["status"], row["failure_reason"]) == ("failed", "content_parts_repr")
    assert row["content"] == "[{'type': 'text', 'text': 'Answer to p0001.'}]"


def test_reruns_of_the_stage_share_one_budget_and_the_stop_says_the_total_and_how_to_continue(tmp_path, capsys):
    priced = {"max_tokens": 100, "concurrency": 1, "budget_usd": 0.0025,
              "price": {"prompt_usd_per_mtok": 0.0, "completion_usd_per_mtok": 10.0}}
    with running(Script(cost_usd=0.001)) as server:
        paths = workspace(tmp_path, 6, base_url=server.base_url, **priced)
        assert [generate.main(argv(paths)) for _ in range(3)] == [0, 0, 0]
        assert server.requests == 2
    err = capsys.readouterr().err
    assert "$0.0020 spent by earlier runs, $0.0005 left" in err
    assert "set generate.budget_usd to at least $0.0060" in err
    m = json.loads(Path(paths["metrics"]).read_text())
    assert (m["spent_usd"], m["journal_spent_usd"], m["budget_usd"]) == (0.0, 0.002, 0.0025)
    assert details(paths)["stop_reason"] == "budget" and m["drops_by_reason"] == {"unsent_budget": 4}


@pytest.mark.parametrize("bad, message", [
    ({"max_attempts": 0}, "generate.max_attempts: 0 is out of range; allowed: >= 1"),
    ({"limit": -1}, "generate.limit: -1 is out of range; allowed: >= 1"),
    ({"concurrency": 0}, "generate.concurrency: 0 is out of range; allowed: >= 1"),
    ({"budget_usd": -1}, "generate.budget_usd: -1 is out of range; allowed: >= 0"),
    ({"budget_usd": 0, "price": {"completion_usd_per_mtok": 1.0}}, "generate.budget_usd is 0 (no budget)"),
])
def test_params_the_code_cannot_run_exit_2_before_any_request(tmp_path, capsys, bad, message):
    with running(Script()) as server:
        paths = workspace(tmp_path, 3, base_url=server.base_url, **bad)
        assert generate.main(argv(paths)) == 2
        assert server.requests == 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_metrics_name_the_journal_by_sha256_and_line_count(tmp_path):
    import hashlib

    with running(Script()) as server:
        paths = workspace(tmp_path, 4, base_url=server.base_url)
        assert generate.main(argv(paths)) == 0
    journal = (Path(paths["out"]) / "journal.jsonl").read_bytes()
    m = json.loads(Path(paths["metrics"]).read_text())
    assert (m["journal_lines"], m["journal_bytes"]) == (4, len(journal))          # the DVC metric: numbers
    assert details(paths)["journal_sha256"] == hashlib.sha256(journal).hexdigest()  # text: beside it


def test_a_provider_echoing_the_key_into_ok_answers_leaves_it_in_no_file_and_the_rows_quarantined(
        tmp_path, monkeypatch, capfd):
    from draftgate.reconstruct.normalise import Dialect, normalise

    key = "sk-or-v1-" + secrets.token_hex(32)
    escaped = "".join(f"\\u{ord(c):04x}" for c in key).encode()      # the key as a JSON escape spells it
    monkeypatch.setenv("DRAFTGATE_TEST_KEY", key)
    per_key = {"p0000": ("echo_key",), "p0001": ("echo_key_escaped",), "p0002": ("http_429_provider",),
               "p0003": ("leaked_error_body", "echo_key")}
    script = Script(api_key=key, per_key=per_key, retry_after_s=0.01,
                    error_metadata={"raw": f"upstream got Authorization: Bearer {key}"})
    with running(script) as server:
        paths = workspace(tmp_path, 5, backend="openrouter", base_url=server.base_url,
                          api_key_env="DRAFTGATE_TEST_KEY", **PAID)
        assert generate.main(argv(paths)) == 0
    out, err = capfd.readouterr()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {"journal.jsonl", "responses.parquet", "metrics.json", "metrics.details.json"} <= {p.name for p in files}
    table = pq.read_table(Path(paths["out"]) / "responses.parquet")
    for text in [p.read_bytes() for p in files] + [json.dumps(table.to_pylist()).encode(), (out + err).encode()]:
        assert key.encode() not in text and key[-16:].encode() not in text and escaped not in text
    rows = {r["prompt_id"]: r for r in table.to_pylist()}
    # The model output is kept as received but for the key; the row says it was cut.
    echoed = rows["id0000"]
    assert echoed["content"] == "Answer to p0000. Your key is [redacted]."
    assert echoed["reasoning"] == "The request said Authorization: Bearer [redacted]"
    assert echoed["tool_calls"] == ('[{"id": "functions.echo:0", "type": "function", "index": 0, "function": '
                                    '{"name": "echo", "arguments": "{\\"key\\": \\"[redacted]\\"}"}}]')
    assert echoed["provider"] == "Scripted ([redacted])" and echoed["generation_id"] == "gen-[redacted]"
    assert json.loads(rows["id0001"]["tool_calls"])[0]["function"]["arguments"] == '{"key": "[redacted]"}'
    assert [rows[f"id000{i}"]["redacted"] for i in range(5)] == [True, True, False, True, False]
    assert {r["status"] for r in rows.values()} == {"ok"} and rows["id0004"]["content"] == "Answer to p0004."
    [line] = [r for r in read_journal(Path(paths["out"]) / "journal.jsonl").records if r["prompt_id"] == "id0000"]
    assert line["redacted"] == ["content", "generation_id", "provider", "reasoning", "tool_calls"]
    m = json.loads(Path(paths["metrics"]).read_text())
    assert (m["redacted_answers"], m["journal_redacted_lines"]) == (3, 0)   # none reached the writer's net
    # Reconstruct cannot rebuild such a row exactly: it quarantines it with its own reason.
    assert normalise(echoed, Dialect(think=None)).quarantine == "secret_in_output"
    assert normalise(rows["id0004"], Dialect(think=None)).quarantine is None


def test_after_a_sigkill_the_rerun_counts_the_requests_in_flight_at_their_worst_case_and_stays_in_budget(tmp_path):
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex

    # Worst case $0.001 a request (100 tokens at $10/Mtok), answers billed $0.0004: 16 in flight at once.
    priced = {"concurrency": 16, "max_tokens": 100, "budget_usd": 0.03, "timeout_s": 5.0,
              "price": {"prompt_usd_per_mtok": 0.0, "completion_usd_per_mtok": 10.0}}
    with running(Script(delay_s=(0.2, 0.4), cost_usd=0.0004)) as server:
        paths = workspace(tmp_path, 120, base_url=server.base_url, **priced)
        journal = Path(paths["out"]) / "journal.jsonl"
        kill_generate_once(paths, journal, lambda data: data.count(b'"status":"ok"') >= 10)
        killed = read_journal(journal)
        finished = {r["prompt_id"] for r in killed.records}
        # Requests the server took whose answer no line holds: each one was reserved first.
        in_flight = [a for a in server.log if f"id{a.key[1:]}" not in finished]
        assert 10 <= len(finished) < 120 and in_flight, "the kill must land mid-run"
        assert len(in_flight) <= len(killed.unsettled) <= 16
        total_at_kill = JournalIndex.scan(journal, line_cost).spent_usd
        assert total_at_kill == pytest.approx(0.0004 * len(finished) + 0.001 * len(killed.unsettled))
        assert generate.main(argv(paths)) == 0
    m = json.loads(Path(paths["metrics"]).read_text())
    assert (m["journal_unsettled_before"], m["journal_spent_before_usd"]) == (len(killed.unsettled),
                                                                             round(total_at_kill, 6))
    final = JournalIndex.scan(journal, line_cost)
    assert details(paths)["stop_reason"] == "budget" and final.spent_usd <= 0.03 + 1e-12
    assert final.unsettled == killed.unsettled          # the killed run's stay counted, the rerun's settled
    assert m["journal_spent_usd"] == pytest.approx(final.spent_usd)


def test_two_fresh_runs_against_a_deterministic_server_write_the_same_table_bytes(tmp_path):
    # No wall time (latency_s, elapsed_s) or run id in the DVC output: regenerating the same
    # answers must not make every downstream stage rerun.
    tables = []
    with running(Script(delay_s=(0.0, 0.05), per_key={"p0001": ("http_503",)}, retry_after_s=0.01)) as server:
        for run_dir in ("a", "b"):
            (tmp_path / run_dir).mkdir()
            paths = workspace(tmp_path / run_dir, 6, base_url=server.base_url, **PAID)
            server.replay()                                   # the same fault schedule both times
            assert generate.main(argv(paths)) == 0
            tables.append((Path(paths["out"]) / "responses.parquet").read_bytes())
    assert tables[0] == tables[1]
    assert "latency_s" not in pq.read_schema(Path(paths["out"]) / "responses.parquet").names
