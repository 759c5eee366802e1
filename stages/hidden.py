"""DVC stage `hidden`: kept token rows -> EAGLE-3 hidden states (data/hidden), resumable.

python -m stages.hidden --params params.yaml --tokens data/tokens/tokens.parquet \
    --gate data/gates/tokens.json --out data/hidden --metrics metrics/hidden.json \
    [--responses data/responses/responses.parquet --prompts data/prompts/prompts.parquet]

Scale out: `torchrun --nproc-per-node N -m stages.hidden <same arguments>` (each rank extracts
its share of the planned shards; rank 0 merges). Offline mode writes shards, index and manifest;
online mode only the index and manifest (docs/hidden-states.md). Exit 1 on unusable input or params.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.hidden", description=__doc__.splitlines()[0])
    p.add_argument("--params", required=True, type=Path)
    p.add_argument("--tokens", required=True, type=Path, help="tokens.parquet (kept rows are extracted)")
    p.add_argument("--gate", required=True, type=Path, help="the tokens gate's metric JSON")
    p.add_argument("--out", required=True, type=Path, help="output directory (shards, index, manifest)")
    p.add_argument("--metrics", required=True, type=Path)
    p.add_argument("--responses", type=Path, help="responses.parquet: prove the served weights (check_served)")
    p.add_argument("--prompts", type=Path, help="prompts.parquet, with --responses")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, as_dict, load_params
    from draftgate.gates.result import GateNotPassed, require_passed
    from draftgate.hidden import dist
    from draftgate.hidden.capture import layer_names, resolve_layers
    from draftgate.hidden.shards import ITEMSIZE, ShardError, read_token_rows
    from draftgate.hidden.target import TargetError, check_served, load_target

    w = dist.world()
    started = time.perf_counter()
    try:
        params = load_params(args.params)
        hp = params.hidden
        require_passed(args.gate, "gate_tokens", "fix the tokens before extracting hidden states")
        if not args.tokens.is_file():
            raise ShardError(f"{args.tokens}: not found; run the reconstruct stage first (dvc repro reconstruct)")
        rows = read_token_rows(args.tokens)
        if not len(rows):
            raise ShardError(f"{args.tokens}: no kept rows (quarantine_reason IS NULL); nothing to extract")
        device = w.device(hp.device)
        dist.init(w, device)
        target = load_target(hp, device)
        served = {"checked": 0, "skipped": "not checked"}
        if w.rank == 0:
            served = _served(args, params, target, check_served)
        layers = resolve_layers(hp.layers, target.num_layers)
    except (ParamsError, GateNotPassed, ShardError, TargetError, ValueError, OSError) as e:
        print(f"hidden: {e}", file=sys.stderr)
        return 1
    key = {"tokens_sha256": rows.sha256, "weights_fingerprint": target.weights_fingerprint,
           "config_sha256": target.config_sha256, "layers": list(layers), "dtype": hp.dtype,
           "compute_dtype": hp.compute_dtype, "shard_max_mb": hp.shard_max_mb, "batch_tokens": hp.batch_tokens}
    per_token = 4 * target.hidden_size * ITEMSIZE[hp.dtype]
    fields = {"mode": hp.mode, "tokens_sha256": rows.sha256, "model": target.identity,
              "tokenizer_fingerprint": target.tokenizer_fingerprint, "dtype": hp.dtype,
              "layers": layer_names(layers, target.num_layers), "final_state": "before_norm",
              "feature_bytes_per_token": per_token,
              "plan": {"batch_tokens": hp.batch_tokens, "shard_max_mb": hp.shard_max_mb}}
    if hp.mode == "online":
        return _online(args, w, rows, key, fields, hp, target, served, started)
    return _offline(args, w, rows, key, fields, hp, target, layers, served, started, as_dict(hp))


def _served(args, params, target, check_served) -> dict:
    hp = params.hidden
    if not hp.check_served:
        return {"checked": 0, "skipped": "hidden.check_served is false"}
    if hp.kind != "embedded" or params.generate.backend != "local":
        return {"checked": 0, "skipped": "the responses came from a remote API or the target is an hf_dir"}
    if args.responses is None or args.prompts is None:
        return {"checked": 0, "skipped": "no --responses/--prompts given"}
    return check_served(target, args.responses, args.prompts, params.generate)


def _offline(args, w, rows, key, fields, hp, target, layers, served, started, hp_dict) -> int:
    from draftgate.hidden import dist
    from draftgate.hidden.capture import padding_fraction
    from draftgate.hidden.extract import extract
    from draftgate.hidden.shards import ShardError, assigned, merge, plan_shards, resume, sidecar

    out = args.out
    plans = plan_shards(rows.lengths, rows.prompt_ids, target.hidden_size, hp.dtype, hp.shard_max_mb,
                        hp.batch_tokens)
    ok, error, stats, resumed = True, "", None, None
    try:
        if w.rank == 0:
            resumed = resume(out, plans, rows, key)
    except Exception as e:   # the other ranks must hear of it, not wait at the barrier
        ok, error = False, f"{type(e).__name__}: {e}"
    if not dist.broadcast_ok(w, ok):
        print(f"hidden: rank {w.rank}: resume failed {error}", file=sys.stderr)
        dist.finish(w)
        return 1
    todo = [p for p in assigned(plans, w.rank, w.size) if not sidecar(out, p.name).is_file()]
    extract_start = time.perf_counter()
    try:
        stats = extract(target, rows, todo, layers, hp.dtype, out, key)
    except Exception as e:
        ok, error = False, f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - extract_start
    all_ok = dist.broadcast_ok(w, ok)
    gathered = dist.gather(w, None if stats is None else
                           {"tokens": stats.tokens, "forward_s": stats.forward_s, "write_s": stats.write_s,
                            "shards": stats.shards, "seconds": seconds})
    if not all_ok:
        print(f"hidden: rank {w.rank}: extraction failed {error}; rerun resumes from the finished shards",
              file=sys.stderr)
        dist.finish(w)
        return 1
    code = 0
    if w.rank == 0:
        try:
            manifest = merge(out, plans, rows, key, fields)
        except (ShardError, OSError) as e:
            print(f"hidden: {e}", file=sys.stderr)
            dist.finish(w)
            return 1
        code = _metrics(args, w, rows, manifest, plans, resumed, gathered, served, hp_dict, padding_fraction,
                        target, started)
    dist.barrier(w)
    dist.finish(w)
    return code


def _metrics(args, w, rows, manifest, plans, resumed, gathered, served, hp_dict, padding_fraction, target,
             started) -> int:
    from draftgate.metrics import StageMetrics

    tokens = manifest["tokens"]
    total_bytes = sum(s["bytes"] for s in manifest["shards"])
    lengths = rows.lengths
    batches = [b for p in plans for b in p.batches]
    extracted = sum(g["tokens"] for g in gathered if g)
    wall = max((g["seconds"] for g in gathered if g), default=0.0)
    forward = max((g["forward_s"] for g in gathered if g), default=0.0)
    per_token = manifest["feature_bytes_per_token"]
    m = StageMetrics("hidden", rows_in=len(rows), rows_out=manifest["rows"])
    m.figures.update({
        "tokens": tokens, "shards": len(manifest["shards"]), "bytes": total_bytes,
        "bytes_per_token": round(total_bytes / max(tokens, 1), 2),
        "feature_bytes_per_token": per_token,
        "bytes_ratio": round(total_bytes / max(tokens, 1) / per_token, 4),
        "padding_fraction": round(padding_fraction(lengths, batches), 4),
        "forward_batches": len(batches),
        "resumed_shards": len(resumed.trusted), "computed_shards": sum(g["shards"] for g in gathered if g),
        "removed_files": len(resumed.removed),
        "extracted_tokens": extracted,
        "world_size": w.size,
        "served_check_rows": served.get("checked", 0),
        "served_check": served.get("skipped", "the responses' request hashes name these weights"),
        "device": target.device,
        "weights_fingerprint": target.weights_fingerprint,
        "layers": manifest["layers"],
        "removed": resumed.removed[:20],
    })
    if extracted:   # a run that only resumed measured no throughput: no figure, rather than 0
        m.figures.update(tokens_per_s=round(extracted / max(wall, 1e-9), 1),
                         forward_tokens_per_s=round(extracted / max(forward, 1e-9), 1))
    m.params = {"hidden": hp_dict}
    m.write(args.metrics)
    print(f"hidden: {manifest['rows']} rows, {tokens:,} tokens in {len(manifest['shards'])} shards "
          f"({total_bytes / 1e6:.1f} MB, {total_bytes / max(tokens, 1):,.0f} B/token = "
          f"{total_bytes / max(tokens, 1) / per_token:.4f}x the features); {len(resumed.trusted)} shards resumed, "
          f"{extracted:,} tokens extracted at {extracted / max(wall, 1e-9):,.0f} tokens/s on {target.device} "
          f"x{w.size}; padding {padding_fraction(lengths, batches):.1%}; "
          f"{time.perf_counter() - started:.1f} s")
    return 0


def _online(args, w, rows, key, fields, hp, target, served, started) -> int:
    from draftgate.hidden import dist
    from draftgate.hidden.shards import write_online
    from draftgate.metrics import StageMetrics

    if w.rank == 0:
        manifest = write_online(args.out, rows, key, fields)
        m = StageMetrics("hidden", rows_in=len(rows), rows_out=manifest["rows"])
        m.figures.update({"tokens": manifest["tokens"], "shards": 0, "bytes": 0, "online": True,
                          "feature_bytes_per_token": manifest["feature_bytes_per_token"],
                          "served_check_rows": served.get("checked", 0),
                          "served_check": served.get("skipped", "the responses' request hashes name these weights"),
                          "weights_fingerprint": target.weights_fingerprint, "layers": manifest["layers"]})
        from draftgate.config import as_dict

        m.params = {"hidden": as_dict(hp)}
        m.write(args.metrics)
        print(f"hidden: online mode: manifest and index for {manifest['rows']} rows, {manifest['tokens']:,} "
              f"tokens (captured on demand by the training loader); {time.perf_counter() - started:.1f} s")
    dist.barrier(w)
    dist.finish(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
