"""Repair on the embedded default, with the model's own sampled ids as the yardstick.

Rows are built the way a text-only API makes them: the local model samples (serve/model.py's
generate_batch, the server's sampler, seeded per row), the text is decoded, and the text method
re-encodes it canonically (the content's ordinary encoding, then <|im_end|> when it stopped); the
bill is the sampled count (the local server counts the end token: counts_end). The search sees
only the prompt ids, the canonical ids and the bill; the sampled ids only grade it.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.repair --temperature 0.7
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.repair --temperature 1.0 --datasets code --repeats 4

Reports: rows, differing rows (canonical != sampled), the share of them made exact with a 95%
Wilson interval, exact rows broken (must be 0), reasons, forwards and tokens scored per row, and
the search's time per phase (base pass, window scoring, exact re-scoring) against the hidden
stage's forward over the same rows, measured in the same run (rows sorted by length, right-padded,
~batch_tokens padded tokens per pass), timed twice after the search: the ratios use the mean.
Misses are split by cause: a search miss (the sampled ids score higher than the choice) or the
posterior preferring another split, each also counted among the rows whose search search_tokens
cut (`Outcome.capped`). Generated rows are cached under
--cache, keyed by the arguments, the weights and the prompt files' bytes (--raw), so a rerun only
searches and other prompt files make new rows.

Through the real vLLM (`--backend vllm`; .venv-engine, `make engine`):

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python -m bench.repair --backend vllm --temperature 0.7

The same rows (generated in process, the same cache) and the same search (search_rows), its scorer
a VllmScorer on the engine the repair stage starts to share its first pass with the hidden stage
(draftgate/repair/engine.py: the embedded model, eager on CPU, 1 GiB KV cache, vLLM's
`extract_hidden_states` with draftgate's connector, a prefix cache): top `repair.top_logprobs` raw
log-probabilities per position, tempered from those (docs/repair.md, "Scoring backends"), and the
first pass's rows named so the engine writes their features, which the rows the search kept give
to a prefill as the stage's do (read and proven: part of the search's seconds). Grading is shared
with the in-process run; the "search_miss" split still re-scores the missed rows with the
in-process target. The baseline is the hidden-style forward of the same rows through the same
engine: one `/v1/completions` request per row, `prompt` its ids (prompt + canonical), `max_tokens`
1, every row in flight at once (the capture runs; no file is named); timed twice, with
`prompt_logprobs` (VllmScorer.score_rows over all rows: what the base pass asks) and without (the
plain prefill). `extra_over_plain` is against the plain one: (search seconds - base-phase seconds)
/ plain prefill seconds. A trie node is a one-token generation request the prefix cache serves
(the first pass's rows ask for prompt logprobs, which vLLM never reads from the cache, so the
baselines are full prefills: `plain_prefix_cache` shows 0 hits). Engine CPU seconds are the
engine process group's (/proc), the client's are this process's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path


def prompt_files_digest(raw: str, datasets: list[str]) -> str:
    """sha256 over the prompt files the rows are sampled from ({raw}/{name}.jsonl, by name and bytes):
    the row cache's key holds it, so other prompt files under the same dataset names are new rows."""
    h = hashlib.sha256()
    for name in datasets:
        path = Path(raw, f"{name}.jsonl")
        if not path.is_file():
            raise SystemExit(f"bench/repair.py: {path} not found; pass --raw the folder holding {name}.jsonl")
        h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def build_rows(lm, tok, args, partial: Path) -> list[dict]:
    from draftgate.prompts import Rejected, normalise
    from draftgate.serve.model import END_TOKEN, Sampling, generate_batch

    end = tok.token_id(END_TOKEN)
    prompts = []
    for name in args.datasets:
        for line in Path(args.raw, f"{name}.jsonl").read_text().splitlines():
            if line.strip():
                try:                                  # the prompts stage's own reading of a record
                    messages, _, _ = normalise(json.loads(line))
                except Rejected:
                    continue
                prompts.append((name, [{"role": m["role"], "content": m["content"] or ""} for m in messages]))
    prompts = prompts[:args.limit] if args.limit else prompts
    jobs = [(name, msgs, r) for r in range(args.repeats) for name, msgs in prompts]
    # Each batch is appended to a partial file as it is made: an interrupted run resumes there,
    # and --rows-so-far searches what exists (batches are seeded by position, so any prefix of
    # the jobs is the same rows a full run makes).
    rows = [json.loads(line) for line in partial.read_text().splitlines()] if partial.is_file() else []
    rows = rows[:len(rows) - len(rows) % args.batch]
    for i in range(len(rows), len(jobs), args.batch):
        chunk = jobs[i:i + args.batch]
        ids = [list(lm.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"]) for _, m, _ in chunk]
        samp = [Sampling(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                         seed=1000 * r + i + k) for k, (_, _, r) in enumerate(chunk)]
        for (name, _, _), p, g in zip(chunk, ids, generate_batch(lm, ids, samp)):
            truth = g.ids
            content = truth[:-1] if g.finish_reason == "stop" else truth
            text = tok.decode(content)            # what an API returns: a string
            canon = tok.encode_ordinary(text) + ([end] if g.finish_reason == "stop" else [])
            rows.append({"dataset": name, "prompt": p, "truth": truth, "canon": canon, "billed": len(truth)})
        with partial.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows[i:]))
        print(f"  generated {len(rows)}/{len(jobs)}", file=sys.stderr)
    return rows


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf",
                    help="score in process (hf) or through vLLM's OpenAI server from .venv-engine (vllm)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--datasets", nargs="+", default=["chat", "code"])
    ap.add_argument("--raw", default="data/raw")
    ap.add_argument("--repeats", type=int, default=1, help="samples per prompt (seeds differ)")
    ap.add_argument("--limit", type=int, default=0, help="first N prompts (0 = all)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--no-bill", action="store_true", help="search without the length constraint")
    ap.add_argument("--cache", default=os.environ.get("TMPDIR", "/tmp") + "/draftgate-repair-bench")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--only", type=int, nargs="*", default=[], help="row indices to search (debugging)")
    ap.add_argument("--verbose", action="store_true", help="one line per row on stderr")
    ap.add_argument("--set", nargs="*", default=[], help="RepairParams overrides key=value")
    ap.add_argument("--generate-only", action="store_true", help="build and cache the rows, search nothing")
    ap.add_argument("--rows-so-far", action="store_true", help="search the rows an unfinished generation made")
    return ap


def plain_forward(lm, rows: list[dict], batch_tokens: int) -> tuple[float, float]:
    """Wall and CPU seconds of the hidden stage's forward over the rows: sorted by length,
    right-padded, about batch_tokens padded tokens per pass (hidden/capture.py's plan_batches),
    decoder only."""
    import torch

    from draftgate.hidden.capture import plan_batches

    seqs = [r["prompt"] + r["canon"] for r in rows]
    t, c = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for batch in plan_batches([len(x) for x in seqs], batch_tokens):
            width = max(len(seqs[i]) for i in batch)
            x = torch.zeros((len(batch), width), dtype=torch.long)
            m = torch.zeros((len(batch), width), dtype=torch.long)
            for j, i in enumerate(batch):
                x[j, :len(seqs[i])] = torch.tensor(seqs[i])
                m[j, :len(seqs[i])] = 1
            lm.model.get_decoder()(input_ids=x, attention_mask=m, use_cache=False)
    return time.perf_counter() - t, time.process_time() - c


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    import torch

    from draftgate.checks.repair import wilson
    from draftgate.config import RepairParams
    from draftgate.repair.score import HFScorer, Sampling
    from draftgate.repair.search import FLOOR, Vocab, search_rows
    from draftgate.serve.model import load, smollm2_tokenizer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    lm = load("cpu")
    tok = smollm2_tokenizer()
    key = hashlib.sha256(json.dumps([args.temperature, args.top_p, args.datasets, args.repeats, args.limit,
                                     args.max_tokens, lm.weights_fingerprint,
                                     prompt_files_digest(args.raw, args.datasets)]).encode()).hexdigest()[:16]
    cached = Path(args.cache, f"rows-{key}.json")
    partial = cached.with_suffix(".partial.jsonl")
    if cached.is_file():
        rows = json.loads(cached.read_text())
    elif args.rows_so_far:
        rows = [json.loads(line) for line in partial.read_text().splitlines()] if partial.is_file() else []
        print(f"  {len(rows)} rows generated so far ({partial})", file=sys.stderr)
    else:
        cached.parent.mkdir(parents=True, exist_ok=True)
        rows = build_rows(lm, tok, args, partial)
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows))
        tmp.replace(cached)
        partial.unlink(missing_ok=True)
    if args.generate_only:
        print(json.dumps({"rows": len(rows), "differing": sum(r["canon"] != r["truth"] for r in rows),
                          "cache": str(cached)}))
        return 0

    overrides = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        overrides[k] = json.loads(v)
    params = RepairParams(**overrides)
    vocab = Vocab.from_tokenizer(tok)

    counts, reasons, fixed_by = Counter(), Counter(), Counter()
    forwards = tokens = 0
    phases: dict[str, list[float]] = {}
    failures = []
    graded = []          # (confidence, confidence_hi, differed, exact after, repaired) per row: calibration
    index = [k for k in range(len(rows)) if not args.only or k in args.only]    # the rows' own numbers
    rows = [rows[k] for k in index]
    target = (lambda r: None) if args.no_bill else (lambda r: r["billed"])
    if args.backend == "vllm":
        scorer, outcomes, search_s, search_cpu, engine_figures = search_through_vllm(rows, target, vocab, params,
                                                                                     args)
    else:
        scorer = HFScorer(lm.model, Sampling(args.temperature, args.top_p), params.branch_tokens)
        # Wall and CPU seconds: on a shared machine the CPU seconds compare better.
        t, c = time.perf_counter(), time.process_time()
        outcomes = list(search_rows([(r["prompt"], r["canon"], target(r)) for r in rows], scorer, vocab, params))
        search_s, search_cpu = time.perf_counter() - t, time.process_time() - c
        # The baseline, twice, after the search: the process's first large forward runs ~10% slower
        # (timed before the search it took 136.7 s against 123.6 s after, and 61.8 s against 55.2 s
        # on the demo's rows), and the speed drifts between runs (the same base pass took 148-185 s
        # in five runs of one day), so the ratios use the mean of two warm timings.
        plain_each = [plain_forward(lm, rows, params.batch_tokens) for _ in range(2)]
    for k, (r, out) in enumerate(zip(rows, outcomes)):
        differs = r["canon"] != r["truth"]
        same_bytes = vocab.bytes_of(r["canon"]) == vocab.bytes_of(r["truth"])
        if args.verbose:
            print(f"  row {index[k]}: {out.status} {out.reason} passes={out.passes} fw={out.forwards:.1f} "
                  f"tok={out.tokens:.0f} cand={out.candidates} exact={out.ids == r['truth']} differs={differs} "
                  f"margins={out.margin_runner_up and round(out.margin_runner_up, 2)},"
                  f"{out.margin_canonical and round(out.margin_canonical, 2)} conf={out.confidence and round(out.confidence, 3)} "
                  f"nodes={out.nodes} tokens_by_phase={ {ph: round(v[1]) for ph, v in out.phases.items()} }",
                  file=sys.stderr, flush=True)
        forwards += out.forwards
        tokens += out.tokens
        for ph, v in out.phases.items():
            acc = phases.setdefault(ph, [0.0, 0.0, 0.0])
            for j in range(3):
                acc[j] += v[j]
        assert vocab.bytes_of(out.ids) == vocab.bytes_of(r["canon"]), "a candidate changed the bytes"
        reasons[out.reason or "repaired"] += 1
        counts["capped"] += out.capped
        exact_after = out.ids == r["truth"]
        if same_bytes and out.confidence is not None:
            graded.append((out.confidence, out.confidence_hi, differs, exact_after, out.status == "repaired"))
        # What ambiguous_margin 1 would have done: keep the text ids where they were admissible
        # (no bill, or the bill's length) and the choice won by under a nat.
        admissible = target(r) is None or target(r) == len(r["canon"])
        close = [m for m in (out.margin_runner_up, out.margin_canonical) if m is not None]
        kept_at_1 = out.status == "repaired" and admissible and bool(close) and min(close) < 1.0
        exact_at_1 = r["canon"] == r["truth"] if kept_at_1 else exact_after
        if not differs:
            counts["exact_broken_at_margin_1"] += not exact_at_1
        elif same_bytes:
            counts["made_exact_at_margin_1"] += exact_at_1
        if not differs:
            counts["exact_before"] += 1
            counts["exact_broken"] += not exact_after
        elif same_bytes:
            counts["differing"] += 1
            counts["made_exact"] += exact_after
            fixed_by[r["dataset"]] += exact_after
            counts[f"differing_{r['dataset']}"] += 1
            if not exact_after:
                ll_truth, ll_got = (sum(max(v, FLOOR) for v in HFScorer(lm.model, scorer.sampling).score(
                    r["prompt"] + ids, len(r["prompt"])).logprobs) for ids in (r["truth"], out.ids))
                kind = miss_kind(vocab, r["canon"], r["truth"], out.reason, ll_truth, ll_got)
                counts[kind] += 1
                counts[f"{kind}_capped"] += out.capped
                failures.append({"row": index[k], "reason": out.reason, "kind": kind, "capped": out.capped,
                                 "ll_truth_minus_chosen":
                                 round(ll_truth - ll_got, 2), "margin_runner_up": out.margin_runner_up,
                                 "canon_len": len(r["canon"]), "truth_len": len(r["truth"]),
                                 "diff": _diff(vocab, r["canon"], r["truth"], out.ids)})
        else:
            counts["semantic"] += 1

    if args.backend == "hf":
        plain_s, plain_cpu = (sum(w for w, _ in plain_each) / 2, sum(c for _, c in plain_each) / 2)

    n, d = len(rows), counts["differing"]
    lo, hi = wilson(counts["made_exact"], d)
    figures = {
        "temperature": args.temperature, "top_p": args.top_p, "datasets": args.datasets, "rows": n,
        "threads": torch.get_num_threads(), "bill": not args.no_bill,
        "differing": d, "made_exact": counts["made_exact"],
        "made_exact_share": counts["made_exact"] / d if d else None, "made_exact_95ci": [lo, hi],
        "differing_by_dataset": {k[10:]: v for k, v in counts.items() if k.startswith("differing_")},
        "made_exact_by_dataset": dict(fixed_by),
        "exact_before": counts["exact_before"], "exact_broken": counts["exact_broken"],
        "at_ambiguous_margin_1": {"made_exact": counts["made_exact_at_margin_1"],
                                  "exact_broken": counts["exact_broken_at_margin_1"]},
        "semantic": counts["semantic"], "outcomes": dict(reasons),
        "forwards_per_row": forwards / n, "tokens_scored_per_row": tokens / n,
        "row_tokens_per_row": sum(len(r["prompt"]) + len(r["canon"]) for r in rows) / n,
        # Proven per row: the sampled ids scored against the choice over the whole row (search_miss:
        # the sampled split scores higher); *_capped: of those, rows whose search search_tokens cut.
        "misses": {k: v for k, v in counts.items()
                   if k.startswith(("search_miss", "posterior_prefers_other", "ambiguous", "special_in_text"))},
        "capped_rows": counts["capped"],
        "phases": {ph: {"forwards_per_row": round(v[0] / n, 2), "tokens_per_row": round(v[1] / n, 1),
                        "s": round(v[2], 2)} for ph, v in phases.items()},
        **({"search_s": round(search_s, 2), "plain_forward_s": round(plain_s, 2),
            "plain_forward_s_each": [round(w, 2) for w, _ in plain_each],
            "extra_over_plain": round((search_s - phases.get("base", [0, 0, 0])[2]) / plain_s, 2),
            "search_over_plain": round(search_s / plain_s, 2),
            "search_cpu_s": round(search_cpu, 2), "plain_forward_cpu_s": round(plain_cpu, 2),
            "search_over_plain_cpu": round(search_cpu / plain_cpu, 2)} if args.backend == "hf" else
           vllm_timings(engine_figures, search_s, search_cpu, phases.get("base", [0, 0, 0])[2])),
        "calibration": calibration(graded),
        # Every search miss (each one is the search's to remove), then the first other misses.
        "params": overrides, "failures": sorted(failures, key=lambda f: f["kind"] != "search_miss")[
            :max(10, counts["search_miss"])],
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


def search_through_vllm(rows: list[dict], target, vocab, params, args) -> tuple:
    """Start vLLM on the embedded model, time both baselines (plain prefill first: module
    docstring), then the search with a VllmScorer; the engine stops before grading."""
    from concurrent.futures import ThreadPoolExecutor

    import tempfile

    from draftgate.config import as_dict, parse_params
    from draftgate.repair.engine import engine_scorer
    from draftgate.repair.score import Sampling, ScoreError, VllmScorer, post_json
    from draftgate.repair.search import search_rows

    sampling = Sampling(args.temperature, args.top_p)
    seqs = [r["prompt"] + r["canon"] for r in rows]
    figures: dict = {"rows_in_flight": len(seqs), "top_logprobs": params.top_logprobs}

    def patient(url: str, body: dict) -> dict:     # every row at once on 2 cores: past post_json's 120 s
        return post_json(url, body, 1800.0)

    # The engine as the repair stage starts it to share its first pass with the hidden stage
    # (repair/engine.py: the hidden capture on, each first-pass row's features kept to a prefill).
    full = parse_params({"repair": {**as_dict(params), "backend": "vllm", "base_url": None},
                         "hidden": {"backend": "vllm"}, "engine": {"kvcache_gib": 1}})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="draftgate-bench-repair-") as tmp, \
            engine_scorer(full, sampling, Path(tmp) / "prefill") as (shared, writer, engine):
        SERVED_NAME = engine.served_name
        figures["start_s"] = round(time.perf_counter() - start, 1)
        figures["log"] = str(engine.log_path)
        url = f"{engine.root_url}/v1/completions"

        def plain(ids: list[int]) -> dict:
            answer = patient(url, {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0.0})
            if answer.get("usage", {}).get("prompt_tokens") != len(ids):
                raise ScoreError(f"{url}: usage {answer.get('usage')} for a {len(ids)}-token prompt")
            return answer

        warm = list(range(1000, 1040))              # unrelated ids: no block of the rows' gets cached
        plain(warm)
        VllmScorer(engine.root_url, SERVED_NAME, sampling, params.top_logprobs, post=patient).score(warm, 1)

        hits0 = prefix_cache(engine.root_url)
        t, c, e = time.perf_counter(), time.process_time(), engine_cpu_s(engine.pid)
        with ThreadPoolExecutor(max(1, len(seqs))) as pool:
            list(pool.map(plain, seqs))
        figures["plain"] = {"s": time.perf_counter() - t, "cpu_s": time.process_time() - c,
                            "engine_cpu_s": engine_cpu_s(engine.pid) - e}
        hits1 = prefix_cache(engine.root_url)
        figures["plain"]["prefix_cache"] = {k: hits1[k] - hits0.get(k, 0) for k in hits1}

        base = VllmScorer(engine.root_url, SERVED_NAME, sampling, params.top_logprobs, post=patient,
                          concurrency=max(1, len(seqs)))
        t, c, e = time.perf_counter(), time.process_time(), engine_cpu_s(engine.pid)
        base.score_rows([(ids, len(r["prompt"]), None) for ids, r in zip(seqs, rows)])
        figures["logprobs"] = {"s": time.perf_counter() - t, "cpu_s": time.process_time() - c,
                               "engine_cpu_s": engine_cpu_s(engine.pid) - e}

        scorer = shared
        triples = [(r["prompt"], r["canon"], target(r)) for r in rows]

        def keep(batch: list) -> None:    # what the stage does with the rows its search kept (run.py)
            kept = [(i, f()) for i, f in batch if f is not None]
            writer.add([f"r{i}" for i, _ in kept], [seqs[i] for i, _ in kept], [f for _, f in kept])

        t, c, e = time.perf_counter(), time.process_time(), engine_cpu_s(engine.pid)
        outcomes = list(search_rows(triples, scorer, vocab, params, prefill=keep))
        search_s, search_cpu = time.perf_counter() - t, time.process_time() - c
        manifest = writer.close()
        figures["prefill"] = {"rows": manifest["rows"], "tokens": manifest["tokens"]}
        figures["search_engine_cpu_s"] = engine_cpu_s(engine.pid) - e
        figures["search_requests"] = scorer.counters.forwards
        figures["search_request_tokens"] = scorer.counters.tokens
    return scorer, outcomes, search_s, search_cpu, figures


def vllm_timings(f: dict, search_s: float, search_cpu: float, base_s: float) -> dict:
    """The timing figures of a --backend vllm run (module docstring)."""
    plain, lp = f["plain"]["s"], f["logprobs"]["s"]
    return {"backend": "vllm", "search_s": round(search_s, 2),
            "engine_prefill_plain_s": round(plain, 2), "engine_prefill_logprobs_s": round(lp, 2),
            "extra_over_plain": round((search_s - base_s) / plain, 2),
            "search_over_plain": round(search_s / plain, 2), "search_over_logprobs": round(search_s / lp, 2),
            "search_cpu_s": round(search_cpu, 2),
            "search_engine_cpu_s": round(f["search_engine_cpu_s"], 2),
            "engine_prefill_plain_engine_cpu_s": round(f["plain"]["engine_cpu_s"], 2),
            "engine_prefill_logprobs_engine_cpu_s": round(f["logprobs"]["engine_cpu_s"], 2),
            "search_over_plain_engine_cpu": round(f["search_engine_cpu_s"] / f["plain"]["engine_cpu_s"], 2)
            if f["plain"]["engine_cpu_s"] else None,
            "engine": {"start_s": f["start_s"], "log": f["log"], "rows_in_flight": f["rows_in_flight"],
                       "top_logprobs": f["top_logprobs"], "search_requests": f["search_requests"],
                       "search_request_tokens": f["search_request_tokens"],
                       "plain_prefix_cache": f["plain"]["prefix_cache"]}}


def engine_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the engine's process group now (/proc/PID/stat, its threads in)."""
    from draftgate.engine.launch import group_members

    ticks = 0
    for pid in group_members(pgid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        ticks += int(fields[11]) + int(fields[12])            # utime, stime (stat fields 14, 15)
    return ticks / os.sysconf("SC_CLK_TCK")


def prefix_cache(root_url: str) -> dict[str, float]:
    """vLLM's prefix-cache counters (tokens queried, tokens hit) from its /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"{root_url}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("queries", "hits"):
            if line.startswith((f"vllm:prefix_cache_{name}_total ", f"vllm:prefix_cache_{name}_total{{")):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def calibration(graded: list[tuple[float, float, bool, bool, bool]]) -> dict:
    """Is the search's posterior of its choice (`Outcome.confidence`, mass at bound for unscored
    windows: errs low; `confidence_hi`, scored windows only: errs high) the share that comes out
    exact? Per bin over every graded row and over the differing ones; and, for a user who keeps
    only rows at or above a confidence, the differing rows kept, made exact, and exact rows broken.
    `repaired_99`: gate_repair's calibration check on the repaired rows (draftgate/checks/repair.py)."""
    from draftgate.checks.repair import interval, wilson

    rep = [g for g in graded if g[4]]
    lo, hi = interval([g[0] for g in rep], [g[1] for g in rep], 0.99) if rep else (0, 0)
    out: dict = {"repaired_99": {"rows": len(rep), "made_exact": sum(g[3] for g in rep), "interval": [lo, hi],
                                 "expected_low": round(sum(g[0] for g in rep), 2),
                                 "expected_high": round(sum(g[1] for g in rep), 2)}}
    for name, k in (("low", 0), ("high", 1)):
        for scope, rows in (("all", graded), ("differing", [g for g in graded if g[2]])):
            if rows:
                out[f"{name}_{scope}"] = {"predicted": round(sum(g[k] for g in rows) / len(rows), 4),
                                          "observed": round(sum(g[3] for g in rows) / len(rows), 4), "rows": len(rows)}
        bins = []
        for lo, hi in ((0, .5), (.5, .8), (.8, .9), (.9, .95), (.95, .99), (.99, 1.01)):
            b = [g for g in graded if lo <= g[k] < hi]
            if b:
                bins.append({"bin": [lo, min(hi, 1)], "rows": len(b), "differing": sum(g[2] for g in b),
                             "mean": round(sum(g[k] for g in b) / len(b), 3),
                             "exact": round(sum(g[3] for g in b) / len(b), 3)})
        out[f"{name}_bins"] = bins
        # The precision/coverage curve a threshold is chosen on, as the stage applies it: among the
        # REPAIRED rows (exact rows broken count as wrong) whose estimate is >= t, the share exact
        # (Wilson 95%); coverage: those made exact over the differing rows.
        at = {}
        d = sum(g[2] for g in graded)
        for t in (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99):
            kept = [g for g in rep if g[k] >= t]
            ok = sum(g[3] for g in kept)
            at[str(t)] = {"repaired_kept": len(kept), "made_exact": ok,
                          "precision": round(ok / len(kept), 3) if kept else None,
                          "ci95": [round(x, 3) for x in wilson(ok, len(kept))],
                          "coverage": round(ok / d, 3) if d else None}
        out[f"{name}_at"] = at
    return out


def miss_kind(vocab, canon: list[int], truth: list[int], reason: str | None, ll_truth: float, ll_got: float) -> str:
    """Why a differing row was not made exact. `special_in_text`: the sampled ids hold a special
    token where the text has its literal string (the model sampled `<|endoftext|>` mid-row and the
    decode wrote it out); the text method encodes such a string as text (FACTS.md: a model may
    write about `<|im_end|>`), and repair edits only the ordinary tokens between specials, so no
    split of the text is the sampled ids. Otherwise the sampled ids more likely than the choice
    over the row (at the bill's length) is a `search_miss`; less likely, the posterior itself
    prefers another split; `ambiguous`: the row kept its ids within ambiguous_margin."""
    if [i for i in truth if i in vocab.added] != [i for i in canon if i in vocab.added]:
        return "special_in_text"
    if reason == "ambiguous":
        return "ambiguous"
    return "search_miss" if ll_truth > ll_got else "posterior_prefers_other"


def _diff(vocab, canon, truth, got) -> dict:
    from draftgate.reconstruct.classify import first_difference

    i = first_difference(canon, truth)
    lo = max(0, i - 2)

    def show(ids):
        return [vocab.pieces[x].decode("utf-8", "backslashreplace") for x in ids[lo:i + 5]]
    return {"at": i, "canon": show(canon), "truth": show(truth), "got": show(got)}


if __name__ == "__main__":
    raise SystemExit(main())
