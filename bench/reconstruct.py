"""Benchmark: reconstructing 20,000 synthetic responses (real Qwen3 tokenizer) vs the baselines.

    .venv/bin/python -m bench.reconstruct [--rows 20000] [--seed 0] [--repeats 3]

- ours:           draftgate.reconstruct.table.reconstruct_files: the stage's whole job, Parquet in
                  and out (responses + prompts read, tokens.parquet written). Normalise, render prompt and completion, one ordinary encode of every
                  distinct text of a chunk, prefix check, truth/logprobs/text choice, match
                  class, flags, billing, Arrow output (prompt ids + completion ids + loss mask).
- per-row loop:   the original approach: per row, the completion as one string (reasoning,
                  content, tool calls with the special tokens written as text) through
                  `tok.hf.encode` (the transformers tokenizer's encode, as the seed run did). It
                  does less than ours: no prompt, no flags, no table.
- encode_batch:   the same completion strings through the Rust core's `encode_batch` in one call
                  (the limit for an HF tokenizer, on every core), and its `encode_batch_fast`.
- tiktoken:       the same strings through tiktoken's native `encode_ordinary_batch` (8 threads).
Targets: ours >= 3x the per-row loop and >= 0.7x tiktoken's batch (`make bench` fails below either). The methods take turns, repeat
after repeat, in one process on the same rows, so the ratios hold on a busy machine even when
absolute times drift; the best of the repeats counts. Ours reconstructs chunks in worker
processes, one per core (reconstruct/parallel.py), each encoding on one thread; on one core it
runs in-process and encodes on a thread per core or on one, whichever it measures faster
(tokenizers.ThreadChoice; the split is recorded: empty when the workers did every encode).
Also checks correctness: our completion ids equal the full-string encode on every row whose text
holds no literal special-token string, and our prompt ids equal the serving engine's encode of
the rendered prompt. Prints a table; writes bench/results/reconstruct.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def corpus_lines(limit: int = 400_000) -> list[str]:
    # Real text of mixed kinds (code, docstrings, comments, prose in strings): the stdlib.
    lines: list[str] = []
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        lines.extend(f.read_text(encoding="utf-8", errors="replace").splitlines())
        if len(lines) >= limit:
            break
    return lines


def synthetic(n: int, seed: int) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    lines = corpus_lines()

    def span(lo: int, hi: int) -> str:
        k = rng.randrange(len(lines) - hi)
        return "\n".join(lines[k:k + rng.randint(lo, hi)]).strip("\n")

    prompts, responses = [], []
    for i in range(n):
        pid = f"p{i:06d}"
        prompts.append({"prompt_id": pid, "dataset": "bench", "split": "train", "tools": None,
                        "messages": json.dumps([{"role": "user", "content": "Explain this:\n" + span(2, 6)}])})
        calls = None
        if rng.random() < 0.2:
            args = json.dumps({"path": f"src/{i}.py", "line": rng.randint(1, 999)}, separators=(",", rng.choice([":", ": "])))
            calls = json.dumps([{"id": f"call_{i}", "type": "function",
                                 "function": {"name": "open_file", "arguments": args}}])
        responses.append({"prompt_id": pid, "dataset": "bench", "status": "ok",
                          "finish_reason": "tool_calls" if calls else "stop",
                          "reasoning": span(3, 20), "content": span(5, 40), "tool_calls": calls,
                          "provider": "bench", "billed_completion_tokens": None})
    return prompts, responses


def full_string(r: dict) -> str:
    # The original approach: the completion as one string, special tokens written as text.
    s = f"<think>\n{r['reasoning']}\n</think>\n\n{r['content']}"
    for k, c in enumerate(json.loads(r["tool_calls"] or "[]")):
        if k > 0 or r["content"]:
            s += "\n"
        s += f'<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": {c["function"]["arguments"]}}}\n</tool_call>'
    return s + "<|im_end|>"


KEEP = ("ours", "per_row_loop", "encode_batch")   # outputs the correctness checks read


def timed(methods: dict, repeats: int) -> tuple[dict[str, float], dict[str, object]]:
    # Best of `repeats` per method, each run after a full collection. The methods take turns
    # (round robin, not one method's repeats back to back), so that a change in the machine's
    # load during the run falls on all of them: on a shared machine the ratios hold even when
    # the absolute times drift, and the minimum is the figure least disturbed by other load.
    best = {k: float("inf") for k in methods}
    out: dict[str, object] = {}
    for _ in range(repeats):
        for k, fn in methods.items():
            out[k] = None       # the previous run's output goes first: no method pays for another's
            gc.collect()
            t = time.perf_counter()
            result = fn()
            best[k] = min(best[k], time.perf_counter() - t)
            out[k] = result if k in KEEP else None
            del result
    return best, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "reconstruct.json")
    args = ap.parse_args(argv)

    import pyarrow as pa

    from draftgate import schema
    from draftgate.io import write_json
    from draftgate.reconstruct.core import Setup
    import tempfile

    import pyarrow.parquet as pq

    from draftgate.reconstruct.table import reconstruct_files
    from draftgate.templates import get_template, render_text
    from draftgate import tokenizers
    from draftgate.tokenizers import load_qwen3

    tok = load_qwen3()
    template = get_template("qwen3")
    ids = {n: tok.token_id(n) for n in template.special_names}
    prompts, responses = synthetic(args.rows, args.seed)
    resp_table = pa.Table.from_pylist([{f: r.get(f) for f in schema.responses().names} for r in responses],
                                      schema=schema.responses())
    prompt_table = pa.Table.from_pylist(prompts)
    work = Path(tempfile.mkdtemp(prefix="bench-reconstruct-"))
    pq.write_table(resp_table, work / "responses.parquet")
    pq.write_table(prompt_table, work / "prompts.parquet")
    texts = [full_string(r) for r in responses]
    core = tok.hf.backend_tokenizer
    enc = tok._tiktoken_encoding
    # Build the tiktoken core and the NFC quick check's probe (tokenizers/fast.py) before any timing.
    tok.encode_ordinary_batch(["warm up", "é"])

    setup = Setup(tok, template, ids, True)
    load = os.getloadavg()[0]
    results, outs = timed({
        "ours": lambda: reconstruct_files(work / "responses.parquet", work / "prompts.parquet",
                                          work / "tokens.parquet", setup),
        "per_row_loop": lambda: [tok.hf.encode(s, add_special_tokens=False) for s in texts],
        "encode_batch": lambda: [e.ids for e in core.encode_batch(texts, add_special_tokens=False)],
        "encode_batch_fast": lambda: core.encode_batch_fast(texts, add_special_tokens=False),
        "tiktoken_ordinary_batch": lambda: enc.encode_ordinary_batch(texts),
    }, args.repeats)
    (res, _, _), loop, batch = outs["ours"], outs["per_row_loop"], outs["encode_batch"]
    table = pq.read_table(work / "tokens.parquet")
    shutil.rmtree(work)

    # Completions: equal to the original approach's ids wherever that approach is right (text
    # without a literal special-token string). Prompts: equal to what a serving engine encodes
    # from the rendered prompt string (the prompts hold no literal special-token text).
    ours_ids = table.column("completion_ids").to_pylist()
    literal = [any(n in r["reasoning"] + r["content"] for n in template.special_names) for r in responses]
    agree = sum(a == b for a, b, lit in zip(ours_ids, loop, literal) if not lit)
    rendered = [render_text(template.render_prompt(json.loads(p["messages"]), None, True)) for p in prompts]
    lens = table.column("prompt_len").to_pylist()
    prompt_agree = sum(ids[:n] == want for ids, n, want in zip(
        table.column("input_ids").to_pylist(), lens, tok.encode_batch(rendered)))
    n_tokens = sum(map(len, batch))
    ratios = {"vs_per_row_loop": results["per_row_loop"] / results["ours"],
              "vs_encode_batch": results["encode_batch"] / results["ours"],
              "vs_encode_batch_fast": results["encode_batch_fast"] / results["ours"],
              "vs_tiktoken": results["tiktoken_ordinary_batch"] / results["ours"]}
    report = {
        "rows": args.rows, "repeats": args.repeats, "completion_tokens": n_tokens,
        "chars": sum(map(len, texts)), "seconds": {k: round(v, 3) for k, v in results.items()},
        "tokens_per_s": {k: round(n_tokens / v) for k, v in results.items()},
        "speedup_of_ours": {k: round(v, 2) for k, v in ratios.items()},
        "targets": {"vs_per_row_loop >= 3": ratios["vs_per_row_loop"] >= 3,
                    "vs_tiktoken >= 0.7": ratios["vs_tiktoken"] >= 0.7},
        "correctness": {"rows_compared": sum(not x for x in literal), "equal_to_full_string_encode": agree,
                        "prompts_equal_to_engine_encode": prompt_agree,
                        "kept": table.column("quarantine_reason").to_pylist().count(None),
                        "quarantine": dict(res.counts["quarantine"])},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_1min_at_start": round(load, 2),
                    "ours_encode_calls_by_threads": dict(sorted(tokenizers.ENCODE_THREADS.used.items()))},
    }
    write_json(args.out, report)
    print(f"{args.rows:,} responses, {n_tokens:,} completion tokens, {report['chars']:,} chars")
    print(f"{'method':<26}{'seconds':>9}{'Mtok/s':>9}{'ours is':>10}")
    for k, v in results.items():
        rel = "" if k == "ours" else f"{v / results['ours']:.2f}x"
        print(f"{k:<26}{v:>9.2f}{n_tokens / v / 1e6:>9.2f}{rel:>10}")
    print(f"targets: {report['targets']}")
    print(f"correct: {agree}/{report['correctness']['rows_compared']} rows equal the full-string encode; "
          f"{prompt_agree}/{args.rows} prompts equal the engine's encode")
    print(f"load average at start {load:.1f} on {os.cpu_count()} cpus; ours' encode calls by thread "
          f"count: {dict(sorted(tokenizers.ENCODE_THREADS.used.items()))}")
    print(f"wrote {args.out}")
    # A wrong result fails first; then a missed target (run it on a quiet machine: the ratios are
    # of one run, but a busy core slows ours' threads more than the one-thread loop).
    ok = agree == report["correctness"]["rows_compared"] and prompt_agree == args.rows
    if not ok or res.counts["quarantine"]:
        print("reconstruct: WRONG RESULT (ids differ from the reference encodes, or rows quarantined)", file=sys.stderr)
        return 1
    from bench.targets import verdict

    return verdict("reconstruct", report["targets"])


if __name__ == "__main__":
    sys.exit(main())
