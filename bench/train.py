"""Drafter training throughput: the training loop (draftgate/drafter/train.py) against a bare torch
loop over the same model and the same batches already collated in memory, for features read
offline (shards) and online (captured by the resident target).

    nice -n 10 .venv/bin/python -m bench.train --hidden data/hidden --tokens data/tokens/tokens.parquet \
        [--rows 32] [--epochs 2] [--out bench/results/train.json]

Figures (tokens = input tokens of the rows trained on, per epoch):
- loop_tokens_per_s: our loop (collate per batch, loss positions, LR schedule, stats, curve)
- bare_tokens_per_s: the same forward/backward/step over pre-collated tensors, nothing else
- ratio = loop / bare (target >= 0.8: the data path is not the bottleneck)
- load_s per mode: reading (offline) or capturing (online) the features and the teacher's argmax,
  which both paths pay once before training
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path



def bare_loop(model, batches, teacher, cfg) -> float:
    """Forward, loss, backward, clip, step over pre-collated batches; seconds."""
    import torch

    from draftgate.drafter.train import step_losses, step_weights

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95))
    weights = step_weights(cfg)
    model.train()
    start = time.perf_counter()
    for batch in batches:
        losses, _, _ = step_losses(model, batch, teacher, cfg.ttt_steps)
        loss = sum(w * l for w, l in zip(weights, losses))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml", type=Path)
    ap.add_argument("--hidden", default="data/hidden", type=Path)
    ap.add_argument("--tokens", default="data/tokens/tokens.parquet", type=Path)
    ap.add_argument("--rows", type=int, default=32, help="training rows used (the first N of the train split)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--modes", default="offline,online")
    ap.add_argument("--out", default="bench/results/train.json", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import dataclasses

    import torch

    from draftgate.config import load_params
    from draftgate.drafter import train as tr
    from draftgate.device import resolve_device
    from draftgate.drafter.run import build_model, Setup
    from draftgate.drafter.vocab import vocab_from_tokens
    from draftgate.hidden.reader import OfflineFeatures, OnlineFeatures, read_manifest
    from draftgate.hidden.shards import read_token_rows
    from draftgate.target import load_target
    from draftgate.io import write_json

    params = load_params(args.params)
    device = resolve_device(params.drafter.device, "drafter.device")
    target = load_target(params.hidden, device=device)
    manifest = read_manifest(args.hidden)
    vmap, prompt_ids, counts = vocab_from_tokens(args.tokens, params.drafter.splits,
                                                 params.drafter.draft_vocab_size, target.vocab_size)
    prompt_ids = prompt_ids[: args.rows]
    # threads=None: both loops run at the process's threads (OMP_NUM_THREADS), recorded below.
    cfg = dataclasses.replace(params.drafter, epochs=args.epochs, checkpoint_every=0, threads=None)
    teacher = tr.Teacher.from_target(target, vmap, device)
    results = {"rows": len(prompt_ids), "epochs": cfg.epochs, "ttt_steps": cfg.ttt_steps,
               "batch_tokens": cfg.batch_tokens, "draft_vocab_size": vmap.size, "device": device,
               "torch_threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
               "modes": {}}
    for mode in args.modes.split(","):
        started = time.perf_counter()
        if mode == "offline":
            source = OfflineFeatures(args.hidden, args.tokens)
        else:
            rows_all = read_token_rows(args.tokens)
            source = OnlineFeatures(target, rows_all, manifest["layers"]["eagle3"], manifest["dtype"])
        rows = tr.prepare_rows(source, prompt_ids, teacher, cfg.ttt_steps)
        load_s = time.perf_counter() - started
        tokens = sum(int(r.input_ids.shape[0]) for r in rows) * cfg.epochs
        setup = Setup(target, source, manifest, vmap, counts, prompt_ids, device)
        model = build_model(params, setup)
        res = tr.train(model, rows, teacher, vmap, cfg, device=device, data_sha256=vmap.data_sha256,
                       checkpoint_dir=None, resume=False, log=lambda _m: None)
        loop_s = res.seconds
        # The bare loop: the same batches, collated before the clock starts.
        model = build_model(params, setup)
        lengths = [int(r.input_ids.shape[0]) for r in rows]
        t2d = torch.as_tensor(vmap.t2d)
        batches = [tr.collate([rows[i] for i in b], t2d, cfg.ttt_steps, device)
                   for e in range(cfg.epochs) for b in tr.plan_epoch(lengths, cfg.batch_tokens, cfg.seed, e)]
        bare_s = bare_loop(model, batches, teacher, cfg)
        results["modes"][mode] = {
            "load_s": round(load_s, 2), "loop_s": round(loop_s, 2), "bare_s": round(bare_s, 2),
            "steps": res.steps, "tokens": tokens,
            "loop_tokens_per_s": round(tokens / loop_s, 1), "bare_tokens_per_s": round(tokens / bare_s, 1),
            "ratio": round(bare_s / loop_s, 3),
            "end_to_end_tokens_per_s": round(tokens / (load_s + loop_s), 1),
            "loss_first": round(res.rows[0]["loss"], 4), "loss_last": round(res.rows[-1]["loss"], 4),
        }
        print(f"{mode}: load {load_s:.1f} s, loop {loop_s:.1f} s vs bare {bare_s:.1f} s "
              f"(ratio {bare_s / loop_s:.2f}), {tokens / loop_s:,.0f} tokens/s", flush=True)
    results["load_average"] = os.getloadavg()[0]
    write_json(args.out, results)
    print(f"wrote {args.out}")
    from bench.targets import verdict

    return verdict("train", {f"{mode}_ratio_ge_0.8": m["ratio"] >= 0.8 for mode, m in results["modes"].items()})


if __name__ == "__main__":
    sys.exit(main())
