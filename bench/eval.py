"""Wall-clock speedup of speculative decoding over plain greedy decoding, on this machine's CPU.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.eval [--prompts N] [--new 64] [--k 4]
                                                    [--drafter data/drafter/sglang]

The same target (params.yaml `hidden:`), the same held-out prompts (data/tokens/tokens.parquet)
and the same KV-cached loop code for every method: plain greedy (one token per forward), n-gram at
vLLM's 5..5 and at the sweep's settings, and the EAGLE-3 drafter when an export exists. Each
method decodes every prompt, first one prompt at a time ("alone": the latency case speculative
decoding is for) then all prompts in one batch ("batched": what the eval stage does); wall and
process CPU seconds are both recorded, with the load
average before and after, because this machine is shared (wall time under contention overstates
every method alike, CPU time is steadier). Also measured: the cost of one verify forward over
k + 1 positions relative to a one-token forward, which bounds what acceptance length can buy on a
CPU. Speedup = greedy seconds / method seconds, reported below 1 when it is below 1.
Writes bench/results/eval.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def forward_cost(model, device: str, prompt: list[int], k: int, reps: int = 20) -> dict:
    """Seconds of a one-token forward and of a (k+1)-token verify forward, after the same prefix."""
    import torch

    from draftgate.evaluate.loop import Session

    out = {}
    with torch.inference_mode(), Session(model, device) as s:
        s.forward(prompt)
        base = s.length
        for width in (1, k + 1):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                s.forward(list(range(100, 100 + width)))
                times.append(time.perf_counter() - t0)
                s.rollback(base)
            times.sort()
            out[f"forward_{width}_tokens_s"] = times[len(times) // 2]      # the median
    out["verify_over_one_token"] = out[f"forward_{k + 1}_tokens_s"] / out["forward_1_tokens_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default=str(REPO / "params.yaml"))
    ap.add_argument("--tokens", default=str(REPO / "data/tokens/tokens.parquet"))
    ap.add_argument("--contract", default=str(REPO / "data/contract/contract.json"))
    ap.add_argument("--drafter", default=str(REPO / "data/drafter/sglang"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--k", type=int, default=None, help="default: eval.k of params.yaml")
    ap.add_argument("--out", default=str(REPO / "bench/results/eval.json"))
    args = ap.parse_args(argv)

    import torch

    from draftgate.config import load_params
    from draftgate.evaluate.loop import (
        greedy_decode, greedy_decode_batch, speculative_decode, speculative_decode_batch)
    from draftgate.evaluate.proposers import Eagle3Proposer, NgramProposer
    from draftgate.evaluate.run import end_ids_from_contract, heldout_rows, load_eagle3
    from draftgate.evaluate.stats import PromptSteps, acceptance_length
    from draftgate.target import load_target
    from draftgate.io import write_json

    params = load_params(args.params)
    k = args.k or params.eval.k
    rows = heldout_rows(args.tokens, args.prompts)
    end_ids = end_ids_from_contract(args.contract)
    target = load_target(params.hidden, params.eval.device)
    model, dev = target.model, target.device
    load_before = os.getloadavg()

    # (name, a factory of one proposer per prompt or None for plain greedy, aux layers)
    methods: list[tuple[str, object, object]] = [("greedy", None, None)]
    pairs = [(params.eval.ngram_min, params.eval.ngram_max)] + [tuple(p) for p in params.eval.ngram_sweep]
    for lo, hi in dict.fromkeys(pairs):
        methods.append((f"ngram_{lo}_{hi}", lambda lo=lo, hi=hi: NgramProposer(lo, hi), None))
    drafter_note = None
    if (Path(args.drafter) / "draftgate.json").is_file():
        drafter = load_eagle3(args.drafter, target)
        methods.append(("eagle3", lambda: Eagle3Proposer(drafter), drafter.config.aux_layers))
    else:
        drafter_note = f"{args.drafter}: no export; run `dvc repro train` to include the drafter"

    # Warm-up (allocator, kernels) on one prompt, not timed.
    greedy_decode(model, dev, rows[0].prompt, 8, end_ids)
    prompts = [r.prompt for r in rows]
    results: dict[str, dict] = {}
    for mode in ("alone", "batched"):
        reference: list[list[int]] = []
        for name, make, layers in methods:
            (w0, c0) = clock()
            if mode == "alone" and make is None:
                outs = [greedy_decode(model, dev, p, args.new, end_ids) for p in prompts]
            elif mode == "alone":
                outs = [speculative_decode(model, dev, p, make(), k, args.new, end_ids, layers) for p in prompts]
            elif make is None:
                outs = greedy_decode_batch(model, dev, prompts, args.new, end_ids)
            else:
                outs = speculative_decode_batch(model, dev, prompts, [make() for _ in prompts], k, args.new,
                                                end_ids, layers)
            (w1, c1) = clock()
            tokens = sum(len(o.ids) for o in outs)
            r = {"wall_s": w1 - w0, "cpu_s": c1 - c0, "tokens": tokens, "tokens_per_s": tokens / (w1 - w0)}
            if make is None:
                reference = [o.ids for o in outs]
            else:
                r["acceptance_length"] = acceptance_length([PromptSteps(o.drafted, o.accepted, o.emitted) for o in outs])
                r["same_ids_as_greedy"] = [o.ids for o in outs] == reference
            results[f"{mode}/{name}"] = r
            print(f"{mode:<8} {name:<12} {tokens} tokens in {w1 - w0:6.1f} s wall, {c1 - c0:6.1f} s CPU"
                  + (f", acceptance length {r['acceptance_length']:.2f}" if make else ""), flush=True)
    for key, r in results.items():
        base = results[key.split("/")[0] + "/greedy"]
        r["speedup_wall"] = base["wall_s"] / r["wall_s"]
        r["speedup_cpu"] = base["cpu_s"] / r["cpu_s"]
    cost = forward_cost(model, dev, rows[0].prompt, k)
    out = {
        "what": "speculative vs plain greedy decoding with the same target and loop code; speedup = greedy "
                "seconds / method seconds (below 1 = slower)",
        "device": dev, "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "load_average_before": load_before[0], "load_average_after": os.getloadavg()[0],
        "prompts": len(rows), "max_new_tokens": args.new, "k": k,
        "methods": results, "forward_cost": cost, "drafter": drafter_note or args.drafter,
    }
    write_json(args.out, out)
    print(f"verify forward over {k + 1} tokens = {cost['verify_over_one_token']:.2f}x a one-token forward; "
          f"load average {load_before[0]:.1f} -> {out['load_average_after']:.1f}; wrote {args.out}")
    for name, r in results.items():
        print(f"  {name:<20} speedup {r['speedup_wall']:.2f}x wall, {r['speedup_cpu']:.2f}x CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
