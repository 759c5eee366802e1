"""The train stage's work: features and tokens in, trained drafter and its two exports out.

`run()` trains and exports, and returns the metrics and the curves; stages/train.py checks the
hidden gate's verdict before it and writes what it returns (tests and bench/train.py drive the
same function).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgate.config import Params, as_dict
from draftgate.device import DeviceError, resolve_device


class RunError(ValueError):
    """The stage cannot train; the message names the input and the fix."""


@dataclass
class TrainRun:
    """A finished run, for the stage to write: its metrics and the per-step curve (rows of loss,
    per-step loss and accuracy)."""
    metrics: Any            # draftgate.metrics.StageMetrics
    curve: list[dict]
    ttt_steps: int


@dataclass
class Setup:
    target: Any
    source: Any
    manifest: dict
    vmap: Any
    counts: Any
    prompt_ids: list[str]
    device: str


def setup(params: Params, hidden_dir: Path, tokens_path: Path, target: Any = None) -> Setup:
    """Target, features, and the draft vocabulary of the training rows."""
    from draftgate.drafter.vocab import VocabError, vocab_from_tokens
    from draftgate.hidden.reader import open_features, read_manifest
    from draftgate.hidden.shards import ShardError
    from draftgate.target import TargetError, load_target
    from draftgate.io import file_sha256

    try:
        device = resolve_device(params.drafter.device, "drafter.device")
    except DeviceError as e:
        raise RunError(str(e)) from None
    try:
        manifest = read_manifest(hidden_dir)
        if manifest.get("final_state", "before_norm") != "before_norm":
            # The teacher runs the target's norm + LM head over the stored final state; a state
            # already normed (a SpecForge import, docs/interop.md) would be normed twice.
            raise RunError(f"{hidden_dir}/manifest.json: final_state {manifest.get('final_state')!r}; training "
                           "reads final states before the norm. Extract with the hidden stage, or export "
                           "these rows to SpecForge (python -m stages.export_data) and train there")
        # The earliest the target's vocabulary is known to training: before hashing the tokens or
        # loading the target (vocab_from_tokens would refuse it too, after both).
        vocab = (manifest.get("model") or {}).get("vocab_size")
        if isinstance(vocab, int) and params.drafter.draft_vocab_size > vocab:
            raise RunError(f"drafter.draft_vocab_size {params.drafter.draft_vocab_size} is larger than the target's "
                           f"vocabulary of {vocab} ids ({hidden_dir}/manifest.json model.vocab_size); a draft "
                           "vocabulary is a subset of the target's: lower it")
        sha = file_sha256(tokens_path)
        if manifest.get("tokens_sha256") != sha:
            raise RunError(f"{hidden_dir}: features were made from tokens sha256 {manifest.get('tokens_sha256')}, "
                           f"{tokens_path} is {sha}; rerun the hidden stage")
        if target is None:
            target = load_target(params.hidden, device=device)
        source = open_features(params.hidden, hidden_dir, tokens_path, target=target)
        vmap, prompt_ids, counts = vocab_from_tokens(tokens_path, params.drafter.splits,
                                                     params.drafter.draft_vocab_size, target.vocab_size)
    except (ShardError, TargetError, VocabError, OSError) as e:
        raise RunError(str(e)) from None
    missing = sorted(set(prompt_ids) - set(source.prompt_ids))
    if missing:
        raise RunError(f"{len(missing)} training rows have no features (e.g. {missing[0]!r}); rerun the hidden stage")
    return Setup(target, source, manifest, vmap, counts, prompt_ids, device)


def build_model(params: Params, s: Setup) -> Any:
    """A fresh drafter sized from the target, or the warm start `drafter.init_from` (whose
    vocabulary map must be the one this data gives)."""
    import torch

    from draftgate.drafter.export import ExportError, load_drafter
    from draftgate.drafter.model import DrafterConfig, Eagle3Drafter
    from draftgate.drafter.vocab import VocabError, from_d2t, require_same

    embed = s.target.embed_tokens.weight.detach().float().cpu()
    layers = list(s.manifest["layers"]["eagle3"])
    if params.drafter.init_from:
        try:
            model = load_drafter(params.drafter.init_from, embed=embed)
        except (ExportError, OSError) as e:
            raise RunError(f"drafter.init_from: {e}") from None
        from draftgate.drafter.export import read_info

        info = read_info(params.drafter.init_from)
        v = info.get("vocab", {})
        stored = from_d2t(model.d2t.numpy(), model.config.vocab_size, v.get("data_sha256", "unknown"))
        try:
            require_same(stored, s.vmap, f"warm start {params.drafter.init_from}")
        except VocabError as e:
            raise RunError(str(e)) from None
        if list(model.config.aux_layers) != layers:
            raise RunError(f"warm start {params.drafter.init_from} fuses layers {list(model.config.aux_layers)}, "
                           f"the features hold {layers}")
        return model
    torch.manual_seed(params.drafter.seed)
    config = DrafterConfig.from_target(s.target.config, s.vmap.size, layers)
    model = Eagle3Drafter(config, embed_weight=embed)
    model.set_vocab(s.vmap.d2t, s.vmap.t2d)
    return model


def run(params: Params, *, hidden_dir: Path, tokens_path: Path, out: Path, checkpoint: Path,
        stop_after: int | None = None, target: Any = None) -> TrainRun | None:
    """Train (resuming from `checkpoint`) and export to `out`/{sglang,speculators} with the vocabulary
    map. None where there is nothing to write: a rank other than 0, or a run stopped by `stop_after`."""
    from draftgate.drafter import export as ex
    from draftgate.drafter import train as tr
    from draftgate.drafter import vocab as vc
    import time

    t0 = time.perf_counter()
    s = setup(params, hidden_dir, tokens_path, target)
    tr.init_distributed(s.device)
    rank, size = tr.world()
    model = build_model(params, s)
    cfg = params.drafter
    teacher = tr.Teacher.from_target(s.target, s.vmap, s.device)
    t1 = time.perf_counter()
    rows = tr.prepare_rows(s.source, s.prompt_ids, teacher, cfg.ttt_steps, threads=cfg.threads)
    if rank == 0:
        print(f"train: target and features {t1 - t0:.1f} s, teacher argmax over {len(rows)} rows "
              f"{time.perf_counter() - t1:.1f} s")
    try:
        result = tr.train(model, rows, teacher, s.vmap, cfg, device=s.device, data_sha256=s.vmap.data_sha256,
                          checkpoint_dir=checkpoint, resume=params.drafter.resume, stop_after=stop_after,
                          log=print if rank == 0 else (lambda _m: None))
    except (tr.TrainError, vc.VocabError) as e:
        raise RunError(str(e)) from None
    if stop_after is not None and result.steps < _total_steps(rows, cfg, size):
        if rank == 0:
            print(f"train: stopped after step {result.steps} as asked (--stop-after); checkpoint in {checkpoint}")
        return None
    tr.check_in_sync(result.param_checksum)
    if rank != 0:
        return None
    model = model.cpu()
    info = {"vocab": s.vmap.describe(), "target": s.manifest.get("model", {}),
            "hidden_manifest": {"tokens_sha256": s.manifest.get("tokens_sha256"), "layers": s.manifest["layers"],
                                "dtype": s.manifest.get("dtype")},
            "train": {"steps": result.steps, "epochs": cfg.epochs, "world_size": size, "params": as_dict(params.drafter)}}
    try:
        verifier = ex.verifier_reference(params.drafter.verifier, s.manifest.get("model", {}),
                                         list(getattr(s.target.config, "architectures", None) or []))
    except ex.ExportError as e:
        raise RunError(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)
    vc.save(s.vmap, out / "vocab.safetensors")
    kw = dict(info=info, dtype=params.drafter.export_dtype, verifier=verifier,
              speculative_tokens=params.drafter.speculative_tokens)
    ex.export_sglang(model, out / "sglang", **kw)
    ex.export_speculators(model, out / "speculators", **kw)
    metrics = _metrics(params, s, result, cfg, vc.coverage(s.vmap, s.counts), len(rows))
    last = result.rows[-1] if result.rows else {}
    print(f"train: {len(rows)} rows, {result.steps} steps x {size} process(es), loss "
          f"{result.rows[0]['loss']:.3f} -> {last.get('loss', float('nan')):.3f}, acc_0 {last.get('acc_0', 0):.3f}; "
          f"{result.seconds:.1f} s; exports in {out}")
    return TrainRun(metrics=metrics, curve=result.rows, ttt_steps=cfg.ttt_steps)


def _total_steps(rows: list, cfg: Any, size: int) -> int:
    from draftgate.drafter.train import plan_epoch

    lengths = [int(r.input_ids.shape[0]) for r in rows]
    return sum(len(plan_epoch(lengths, cfg.batch_tokens, cfg.seed, e)) // size for e in range(cfg.epochs))


def _metrics(params: Params, s: Setup, result: Any, cfg: Any, cover: float, n_rows: int) -> Any:
    import numpy as np

    from draftgate.drafter.train import loss_drop
    from draftgate.metrics import StageMetrics

    window = params.gates.drafter.loss_window
    losses = [r["loss"] for r in result.rows]
    tail = result.rows[-max(1, min(window, len(result.rows))):]
    m = StageMetrics("train", rows_in=len(s.prompt_ids), rows_out=n_rows)
    m.figures.update({
        "steps": result.steps, "epochs": cfg.epochs, "world_size": result.world_size,
        "resumed_from_step": result.resumed_from,
        "loss_first": float(np.mean(losses[:window])) if losses else None,
        "loss_last": float(np.mean(losses[-window:])) if losses else None,
        "loss_drop": loss_drop(losses, window),
        "accuracy_last": {f"step_{i}": float(np.mean([r[f"acc_{i}"] for r in tail])) for i in range(cfg.ttt_steps)},
        "loss_positions_per_epoch": int(sum(r["positions"] for r in result.rows) / max(1, cfg.epochs)),
        "draft_vocab": {"size": s.vmap.size, "seen": s.vmap.seen, "coverage": cover,
                        "map_sha256": s.vmap.map_sha256, "data_sha256": s.vmap.data_sha256},
    })
    m.params = {"drafter": as_dict(params.drafter)}
    return m
