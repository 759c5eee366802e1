"""The hidden stage's work: kept token rows -> EAGLE-3 features (shards, index, manifest last).

`run(params, HiddenRequest(...))` loads the target, proves it is the one the responses were
generated with (check_served), plans the shards, resumes the finished ones, extracts this rank's
share (extract.py, or vllm_backend.py through the engine: rows whose ids equal the repair stage's
prefill are copied from it, the others forwarded; docs/repair.md, "One prefill for two stages"), and on rank 0 merges and returns the metrics; stages/hidden.py checks the
tokens gate's verdict before it and writes them. Under torchrun every rank calls it; a failure on
any rank is broadcast, so none waits at a barrier for one that died (dist.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgate.hidden import dist


class HiddenError(ValueError):
    """The stage cannot extract; the message names the input and the fix (a rerun resumes)."""


@dataclass(frozen=True)
class HiddenRequest:
    tokens: Path                      # tokens.parquet: its kept rows are extracted
    out: Path                         # the hidden-state directory
    responses: Path | None = None     # with `prompts`: prove the served weights (check_served)
    prompts: Path | None = None
    prefill: Path | None = None       # the repair stage's base-pass features (draftgate/prefill.py)


@dataclass(frozen=True)
class Job:
    """One run's inputs once resolved: what every step below reads."""
    request: HiddenRequest
    params: Any
    world: Any
    rows: Any                         # shards.TokenRows
    target: Any
    layers: tuple[int, ...]
    served: dict
    key: dict                         # what a resumed shard's record must equal
    fields: dict                      # the manifest's fields besides rows and shards
    started: float
    engine: str | None = None         # backend vllm: the engine's distribution and version
    prefill: Any = None               # prefill.Prefill the rows in `reuse` are copied from
    reuse: frozenset = frozenset()    # table positions whose ids equal the prefill's row
    prefill_note: str = ""            # why no row is reused, where none is


def run(params: Any, request: HiddenRequest) -> Any:
    """The metrics (draftgate.metrics.StageMetrics) on rank 0, None on the other ranks."""
    from draftgate.hidden.capture import layer_names
    from draftgate.target import resolve_layers
    from draftgate.hidden.shards import ITEMSIZE, read_token_rows
    from draftgate.target import check_served, describe_target, load_target

    w = dist.world()
    started = time.perf_counter()
    hp = params.hidden
    try:
        if not request.tokens.is_file():
            raise HiddenError(f"{request.tokens}: not found; run the reconstruct stage first (dvc repro reconstruct)")
        rows = read_token_rows(request.tokens)
        if not len(rows):
            raise HiddenError(f"{request.tokens}: no kept rows (quarantine_reason IS NULL); nothing to extract")
        engine = None
        if hp.backend == "vllm":      # the engine loads the weights; this process only plans and writes
            from draftgate.engine.launch import engine_python
            from draftgate.engine.spool import engine_version

            if w.size > 1:
                raise HiddenError(f"hidden.backend vllm runs one driver, not {w.size} torchrun ranks: the engine "
                                  "parallelises (engine.tensor_parallel); start the stage without torchrun")
            target = describe_target(hp)
            engine = engine_version(engine_python(params.engine.python))
        else:
            device = w.device(hp.device)
            dist.init(w, device)
            target = load_target(hp, device)
        served = _served(request, params, target, check_served) if w.rank == 0 else {"checked": 0, "skipped": "not checked"}
        layers = resolve_layers(hp.layers, target.num_layers)
    except (ValueError, OSError, RuntimeError) as e:   # ShardError, TargetError, DeviceError, EngineError, bad layers: each names its fix
        raise HiddenError(str(e)) from None
    key = {"tokens_sha256": rows.sha256, "weights_fingerprint": target.weights_fingerprint,
           "config_sha256": target.config_sha256, "layers": list(layers), "dtype": hp.dtype,
           "compute_dtype": hp.compute_dtype, "shard_max_mb": hp.shard_max_mb, "batch_tokens": hp.batch_tokens,
           "threads": hp.threads}      # the bytes depend on it (device.torch_threads)
    fields = {"mode": hp.mode, "tokens_sha256": rows.sha256, "model": target.identity,
              "tokenizer_fingerprint": target.tokenizer_fingerprint, "dtype": hp.dtype,
              "layers": layer_names(layers, target.num_layers), "final_state": "before_norm",
              "feature_bytes_per_token": 4 * target.hidden_size * ITEMSIZE[hp.dtype],
              "plan": {"batch_tokens": hp.batch_tokens, "shard_max_mb": hp.shard_max_mb}}
    if engine is not None:
        # The engine's bits: its build and its tensor-parallel split, not torch's threads here.
        from draftgate.prefill import engine_fields

        key = {**{k: v for k, v in key.items() if k != "threads"}, **engine_fields(engine, params.engine.tensor_parallel)}
        fields = {**fields, "backend": "vllm", "engine": engine}
    prefill, reuse, note = _reusable(request, params, rows, target, layers, engine)
    if reuse:     # the copied rows' last bits are the prefill's (its batching): a resumed shard must share them
        key = {**key, "prefill_sha256": prefill.sha256}
    job = Job(request, params, w, rows, target, tuple(layers), served, key, fields, started, engine,
              prefill, reuse, note)
    return _online(job) if hp.mode == "online" else _offline(job)


def _reusable(request: HiddenRequest, params: Any, rows: Any, target: Any, layers: Any,
              engine: str | None) -> tuple[Any, frozenset, str]:
    """The prefill and the table positions whose ids equal its stored row (compared, never taken
    from a flag), or none and why. Its key must be this stage's: the in-process target's features
    for the in-process path, the same engine build's for hidden.backend vllm."""
    import numpy as np

    from draftgate.prefill import ENGINE_FIELDS, KEY_FIELDS, engine_fields, feature_key, open_prefill

    hp = params.hidden

    if request.prefill is None:
        return None, frozenset(), "no --prefill given"
    if hp.mode != "offline":
        return None, frozenset(), f"hidden.mode {hp.mode}: no features are stored"
    prefill, why = open_prefill(request.prefill)
    if prefill is None:
        return None, frozenset(), why
    mine = feature_key(target, layers, hp.dtype)
    if engine is not None:     # the repair stage's engine (repair/engine.py): the same build and split
        mine = {**mine, **engine_fields(engine, params.engine.tensor_parallel)}
    differ = [k for k in (*KEY_FIELDS, *ENGINE_FIELDS) if prefill.key.get(k) != mine.get(k)]
    if differ:
        return None, frozenset(), f"its features differ from this stage's in {', '.join(differ)}"
    reuse = frozenset(i for i, pid in enumerate(rows.prompt_ids)
                      if pid in prefill.ids and np.array_equal(prefill.ids[pid], rows.input_ids[i]))
    return prefill, reuse, "" if reuse else "no row of the table has the prefill's ids"


def _served(request: HiddenRequest, params: Any, target: Any, check_served: Any) -> dict:
    hp = params.hidden
    if not hp.check_served:
        return {"checked": 0, "skipped": "hidden.check_served is false"}
    gp = params.generate
    # The local server serves the embedded model only; a vLLM draftgate started serves the target
    # (embedded or hf_dir) and hashes the same identity keys into each request (engine/target.py).
    # A vLLM at a base_url is named by what it reports, not its weights: nothing to prove against.
    if not ((gp.backend == "local" and hp.kind == "embedded") or (gp.backend == "vllm" and not gp.base_url)):
        return {"checked": 0, "skipped": "the responses came from a remote API or a server draftgate did not start"}
    if request.responses is None or request.prompts is None:
        return {"checked": 0, "skipped": "no --responses/--prompts given"}
    return check_served(target, request.responses, request.prompts, params.generate)


def _fail(w: Any, message: str) -> HiddenError:
    dist.finish(w)
    return HiddenError(message)


def _offline(job: Job) -> Any:
    from draftgate.hidden.extract import extract
    from draftgate.hidden.shards import ShardError, assigned, merge, plan_shards, resume, sidecar

    w, hp, rows, out = job.world, job.params.hidden, job.rows, job.request.out
    plans = plan_shards(rows.lengths, rows.prompt_ids, job.target.hidden_size, hp.dtype, hp.shard_max_mb,
                        hp.batch_tokens)
    ok, error, resumed = True, "", None
    try:
        if w.rank == 0:
            resumed = resume(out, plans, rows, job.key)
    except Exception as e:   # the other ranks must hear of it, not wait at the barrier
        ok, error = False, f"{type(e).__name__}: {e}"
    if not dist.broadcast_ok(w, ok):
        raise _fail(w, f"rank {w.rank}: resume failed {error}")
    todo = [p for p in assigned(plans, w.rank, w.size) if not sidecar(out, p.name).is_file()]
    extract_start = time.perf_counter()
    figures = None
    try:
        if job.engine is not None:
            from draftgate.hidden.vllm_backend import extract_with_engine

            figures = extract_with_engine(job, todo)
        else:
            stats = extract(job.target, rows, todo, job.layers, hp.dtype, out, job.key,
                            prefill=job.prefill, reuse=job.reuse)
            figures = {"tokens": stats.tokens, "forward_s": stats.forward_s, "write_s": stats.write_s,
                       "shards": stats.shards, "seconds": time.perf_counter() - extract_start,
                       "reused_rows": stats.reused_rows, "reused_tokens": stats.reused_tokens,
                       "extracted_rows": stats.rows - stats.reused_rows}
    except Exception as e:
        ok, error = False, f"{type(e).__name__}: {e}"
    all_ok = dist.broadcast_ok(w, ok)
    gathered = dist.gather(w, figures)
    if not all_ok:
        raise _fail(w, f"rank {w.rank}: extraction failed {error}; rerun resumes from the finished shards")
    metrics = None
    if w.rank == 0:
        try:
            manifest = merge(out, plans, rows, job.key, job.fields)
        except (ShardError, OSError) as e:
            raise _fail(w, str(e)) from None
        metrics = _metrics(job, manifest, plans, resumed, gathered)
    dist.barrier(w)
    dist.finish(w)
    return metrics


def _metrics(job: Job, manifest: dict, plans: list, resumed: Any, gathered: list) -> Any:
    from draftgate.config import as_dict
    from draftgate.hidden.capture import padding_fraction
    from draftgate.metrics import StageMetrics

    w, rows, target, served = job.world, job.rows, job.target, job.served
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
        # One prefill for two stages (docs/repair.md): rows copied from the repair stage's base
        # pass this run, and rows forwarded here (repaired rows, rows the prefill lacks).
        "prefill_rows": sum(g.get("reused_rows", 0) for g in gathered if g),
        "prefill_tokens": sum(g.get("reused_tokens", 0) for g in gathered if g),
        "extracted_rows": sum(g.get("extracted_rows", 0) for g in gathered if g),
        "world_size": w.size,
        "served_check_rows": served.get("checked", 0),
        "served_check": served.get("skipped", "the responses' request hashes name these weights"),
        "device": target.device if job.engine is None else job.engine,
        "weights_fingerprint": target.weights_fingerprint,
        "layers": manifest["layers"],
        "removed": resumed.removed[:20],
    })
    if job.prefill_note:
        m.figures["prefill_unused"] = job.prefill_note
    if extracted:   # a run that only resumed measured no throughput: no figure, rather than 0
        m.figures.update(tokens_per_s=round(extracted / max(wall, 1e-9), 1),
                         forward_tokens_per_s=round(extracted / max(forward, 1e-9), 1))
    m.params = {"hidden": as_dict(job.params.hidden)}
    print(f"hidden: {manifest['rows']} rows, {tokens:,} tokens in {len(manifest['shards'])} shards "
          f"({total_bytes / 1e6:.1f} MB, {total_bytes / max(tokens, 1):,.0f} B/token = "
          f"{total_bytes / max(tokens, 1) / per_token:.4f}x the features); {len(resumed.trusted)} shards resumed, "
          f"{extracted:,} tokens extracted at {extracted / max(wall, 1e-9):,.0f} tokens/s on {target.device} "
          f"x{w.size}; padding {padding_fraction(lengths, batches):.1%}; "
          f"{time.perf_counter() - job.started:.1f} s")
    return m


def _online(job: Job) -> Any:
    from draftgate.config import as_dict
    from draftgate.hidden.shards import write_online
    from draftgate.metrics import StageMetrics

    w, target, served = job.world, job.target, job.served
    m = None
    if w.rank == 0:
        manifest = write_online(job.request.out, job.rows, job.key, job.fields)
        m = StageMetrics("hidden", rows_in=len(job.rows), rows_out=manifest["rows"])
        m.figures.update({"tokens": manifest["tokens"], "shards": 0, "bytes": 0, "online": True,
                          "feature_bytes_per_token": manifest["feature_bytes_per_token"],
                          "served_check_rows": served.get("checked", 0),
                          "served_check": served.get("skipped", "the responses' request hashes name these weights"),
                          "weights_fingerprint": target.weights_fingerprint, "layers": manifest["layers"]})
        m.params = {"hidden": as_dict(job.params.hidden)}
        print(f"hidden: online mode: manifest and index for {manifest['rows']} rows, {manifest['tokens']:,} "
              f"tokens (captured on demand by the training loader); {time.perf_counter() - job.started:.1f} s")
    dist.barrier(w)
    dist.finish(w)
    return m
