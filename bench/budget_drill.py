"""Budget drill: what the journal spends against `generate.budget_usd`, over reruns and across a kill -9.

    .venv/bin/python -m bench.budget_drill [--code DIR] [--prompts 400] [--concurrency 32] [--skip-kill]

Loopback only (draftgate/serve/scripted.py). Every request's worst case is $0.001 (max_tokens 100
at $10/Mtok, prompts priced at 0); an answer (or a billed error) costs $0.0004 (usage.cost).

1. Rising reruns: one journal, three runs at budgets $0.004, $0.008, $0.012, against a server
   that answers 40% of attempts with a fault: lost answers (resets, unreadable 200s, timeouts,
   counted at their worst case), billed errors and junk 200s, free 429s and 503s. Per run: the
   journal's total as a rerun counts it (settled lines + unsettled reservations at worst case),
   and what the server billed if every request it took was billed (an upper bound on the real
   bill: the journal's total must bound it).
2. A kill: the generate stage in a subprocess against a slow server (0.2-0.6 s an answer),
   SIGKILLed after `--kill-after` answers; then the rerun, to a budget of $0.05. Reports the
   requests in flight at the kill (taken by the server, no answer journaled), the reservations
   left unsettled, the total at the kill and after the rerun, and the server's bill.

`--code DIR` imports draftgate and stages from another checkout (e.g. `git archive` of an older
commit), to compare. Writes bench/results/budget_drill.json (this checkout's code only).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORST, COST = 0.001, 0.0004
PRICED = {"max_tokens": 100, "price": {"prompt_usd_per_mtok": 0.0, "completion_usd_per_mtok": 10.0}}
FAULTS = ("reset", "malformed_json", "timeout", "http_502_paid", "error_body_paid", "leaked_error_body",
          "http_429", "http_503")
# What a request costs on the server's side when its answer is billed: everything that generated.
UNBILLED = {"http_429", "http_503", "http_500", "http_502", "http_408", "http_402_inflight", "http_429_provider",
            "error_body", "http_400", "http_401", "http_403", "http_402_credits", "http_403_key_limit"}


def billed(server) -> float:
    return COST * sum(1 for a in server.log if a.action not in UNBILLED)


def journal_total(path: Path) -> float:
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex

    return JournalIndex.scan(path, line_cost).spent_usd


def rising_reruns(n: int, concurrency: int) -> list[dict]:
    from draftgate.client import Target, run
    from draftgate.client.request import Prompt
    from draftgate.config import parse_params
    from draftgate.serve.scripted import Script, running

    prompts = [Prompt(f"id{i:04d}", "drill", [{"role": "user", "content": f"p{i:04d}"}], None, 40) for i in range(n)]
    script = Script(fault_rate=0.4, faults=FAULTS, seed=11, cost_usd=COST, hang_s=1.0, retry_after_s=0.01)
    out = []
    with tempfile.TemporaryDirectory() as tmp, running(script) as server:
        journal = Path(tmp) / "journal.jsonl"
        for budget in (0.004, 0.008, 0.012):
            gp = parse_params({"generate": {"backend": "openai", "model": "drill", "concurrency": concurrency,
                                            "timeout_s": 0.3, "retry_base_s": 0.005, "retry_max_s": 0.02,
                                            "max_attempts": 4, "budget_usd": budget, **PRICED}}).generate
            r = run(prompts, gp, Target(server.base_url), journal, progress=False)
            total = journal_total(journal)
            out.append({"budget_usd": budget, "journal_total_usd": round(total, 6),
                        "server_billed_at_most_usd": round(billed(server), 6),
                        "within_budget": total <= budget + 1e-12, "ok_this_run": r.ok,
                        "http_requests": len(server.log), "stop_reason": r.stop_reason,
                        "refused_retries": getattr(r, "refused_retries", None)})
    return out


def kill_drill(n: int, concurrency: int, kill_after: int, budget: float, code: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from draftgate import schema
    from draftgate.client.journal import read_journal
    from draftgate.serve.scripted import Script, running
    from stages import generate

    with tempfile.TemporaryDirectory() as tmp, running(Script(delay_s=(0.2, 0.6), cost_usd=COST)) as server:
        tmp = Path(tmp)
        rows = [{"prompt_id": f"id{i:04d}", "dataset": "drill", "split": "train", "source": f"drill.jsonl:{i + 1}",
                 "messages": json.dumps([{"role": "user", "content": f"p{i:04d}"}]), "tools": None,
                 "n_duplicates": 0} for i in range(n)]
        pq.write_table(pa.Table.from_pylist(rows, schema=schema.prompts()), tmp / "prompts.parquet")
        (tmp / "gate.json").write_text(json.dumps({"success": True}))
        gp = {"backend": "openai", "model": "drill", "concurrency": concurrency, "timeout_s": 5.0,
              "base_url": server.base_url, "budget_usd": budget, **PRICED}
        (tmp / "params.yaml").write_text(yaml.safe_dump({"generate": gp}))
        argv = ["--params", str(tmp / "params.yaml"), "--prompts", str(tmp / "prompts.parquet"),
                "--gate", str(tmp / "gate.json"), "--out", str(tmp / "responses"), "--metrics", str(tmp / "m.json")]
        journal = tmp / "responses" / "journal.jsonl"
        proc = subprocess.Popen([sys.executable, "-m", "stages.generate", *argv], cwd=code,
                                env={**os.environ, "PYTHONPATH": str(code)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and journal.read_bytes().count(b'"status":"ok"') >= kill_after:
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = read_journal(journal)
        finished = {r["prompt_id"] for r in killed.records}
        in_flight = sum(1 for a in server.log if f"id{a.key[1:]}" not in finished)
        at_kill, billed_at_kill = journal_total(journal), billed(server)
        code = generate.main(argv)
        final = read_journal(journal)
        return {"budget_usd": budget, "concurrency": concurrency, "answers_at_kill": len(finished),
                "requests_in_flight_at_kill": in_flight, "unsettled_reservations": len(getattr(killed, "unsettled", ())),
                "journal_total_at_kill_usd": round(at_kill, 6), "server_billed_at_kill_usd": round(billed_at_kill, 6),
                "rerun_exit": code, "rerun_ok_total": sum(r["status"] == "ok" for r in final.records),
                "journal_total_final_usd": round(journal_total(journal), 6),
                "server_billed_final_usd": round(billed(server), 6),
                "within_budget": journal_total(journal) <= budget + 1e-12}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/budget_drill.py", description=__doc__.splitlines()[0])
    p.add_argument("--code", help="a checkout whose draftgate part 1 imports (default: this one)")
    p.add_argument("--prompts", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--kill-after", type=int, default=40)
    p.add_argument("--kill-budget", type=float, default=0.05)
    p.add_argument("--skip-kill", action="store_true")
    a = p.parse_args(argv)
    code = Path(a.code).resolve() if a.code else REPO
    if a.code:     # another checkout's draftgate, imported ahead of this one's: the point of --code
        sys.path.insert(0, str(code))
    result = {"code": a.code or str(REPO), "rising_reruns": rising_reruns(a.prompts, a.concurrency)}
    for r in result["rising_reruns"]:
        print(f"budget ${r['budget_usd']:.3f}: journal total ${r['journal_total_usd']:.6f} "
              f"(server billed at most ${r['server_billed_at_most_usd']:.6f}), within: {r['within_budget']}, "
              f"{r['http_requests']} requests so far, stop {r['stop_reason']}")
    if not a.skip_kill:
        k = result["kill"] = kill_drill(a.prompts, a.concurrency, a.kill_after, a.kill_budget, code)
        print(f"kill -9 after {k['answers_at_kill']} answers: {k['requests_in_flight_at_kill']} requests in flight, "
              f"{k['unsettled_reservations']} reservations unsettled; total ${k['journal_total_at_kill_usd']:.6f} "
              f"(server billed ${k['server_billed_at_kill_usd']:.6f}); after the rerun "
              f"${k['journal_total_final_usd']:.6f} of ${k['budget_usd']:.3f} (server billed "
              f"${k['server_billed_final_usd']:.6f}), within: {k['within_budget']}")
    out = REPO / "bench" / "results" / "budget_drill.json"
    if not a.code:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    ok = all(r["within_budget"] for r in result["rising_reruns"]) and result.get("kill", {}).get("within_budget", True)
    return 0 if ok or a.code else 1


if __name__ == "__main__":
    sys.exit(main())
