"""Training the drafter: training-time test over target features, against the target's own
distribution (docs/drafter.md, "Training").

Loss: at TTT step i, position t predicts token t+2+i; the teacher is the target's softmax at
position t+1+i, restricted to the draft vocabulary and renormalised, computed from the stored
final state (before the final norm) through the target's norm and LM head. A position counts
when the predicted token is a completion token (the loss mask) and the target's argmax there is
in the draft vocabulary. Step i's loss is the mean soft cross-entropy over its positions; the
total is sum_i decay^i * loss_i. Per-step accuracy: the drafter's top-1, mapped to a target id,
equals the target's argmax (teacher-forced, SpecForge's definition).

Optimisation: AdamW, linear warmup then cosine to `min_lr_ratio`, gradient clipping, seeded.
Batches are rows shuffled per epoch by (seed, epoch) and packed under `batch_tokens` padded
tokens, so a resumed run sees the same batches in the same order and continues the same curve.
Data parallel: under torchrun each rank takes every world-th batch and gradients are averaged
(all-reduce), gloo on CPU, nccl on CUDA.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from draftgate.config import DrafterParams, as_dict
from draftgate.device import torch_threads
from draftgate.drafter.vocab import VocabMap, require_same

CHECKPOINT = "state.pt"


class TrainError(ValueError):
    """Training cannot start or continue; the message says why and how to fix it."""


@dataclass
class Row:
    """One training row in memory: float32 features, the teacher's argmax per position."""
    prompt_id: str
    input_ids: Any        # LongTensor [T]
    loss_mask: Any        # BoolTensor [T]
    aux: Any              # float [T, 3, H]
    final: Any            # float [T, H]
    teacher_argmax: Any   # LongTensor [T] (-1 where no loss reads it)


@dataclass
class Teacher:
    """The target's frozen final norm and LM head, the head cut to the draft vocabulary."""
    norm: Callable[[Any], Any]
    head_draft: Any       # [Vd, H]
    full_logits: Callable[[Any], Any]   # Target.logits_from_final

    @classmethod
    def from_target(cls, target: Any, vmap: VocabMap, device: str) -> "Teacher":
        import torch

        w = target.lm_head.weight.detach().float()
        head = w[torch.as_tensor(vmap.draft_ids, device=w.device)].to(device)
        norm = target.norm

        def apply_norm(x: Any) -> Any:
            p = next(norm.parameters())
            with torch.no_grad():
                return norm(x.to(device=p.device, dtype=p.dtype)).float().to(device)

        return cls(norm=apply_norm, head_draft=head, full_logits=target.logits_from_final)

    def draft_probs(self, final: Any) -> Any:
        import torch

        with torch.no_grad():
            return torch.softmax(self.norm(final) @ self.head_draft.T, dim=-1)

    def argmax(self, final: Any, chunk: int = 256) -> Any:
        import torch

        out = [self.full_logits(final[i:i + chunk]).argmax(-1).cpu() for i in range(0, final.shape[0], chunk)]
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def step_weights(cfg: DrafterParams) -> list[float]:
    return [cfg.ttt_decay ** i for i in range(cfg.ttt_steps)]


@dataclass
class Result:
    rows: list[dict]                 # one per optimizer step: the curve
    steps: int
    epochs: int
    world_size: int
    resumed_from: int                # 0: a fresh start
    positions: int                   # loss positions of step 0 over the run, this rank
    seconds: float
    param_checksum: float
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------ data

def loss_positions(loss_mask: Any, teacher_argmax: Any, t2d: Any, steps: int) -> Any:
    """valid[i, t]: TTT step i at position t carries loss (see the module docstring)."""
    import torch

    n = loss_mask.shape[0]
    in_draft = torch.zeros(n, dtype=torch.bool)
    has = teacher_argmax >= 0
    in_draft[has] = t2d[teacher_argmax[has]]
    valid = torch.zeros(steps, n, dtype=torch.bool)
    for i in range(steps):
        j = torch.arange(n) + 1 + i              # the teacher's position
        ok = j + 1 < n
        jj = j[ok]
        valid[i, :ok.sum()] = loss_mask[jj + 1] & in_draft[jj]
    return valid


def prepare_rows(source: Any, prompt_ids: Sequence[str], teacher: Teacher, steps: int,
                 threads: int | None = None) -> list[Row]:
    """Features in float32 with the teacher's argmax at every position some step reads, with
    torch on `threads` threads (drafter.threads: the argmax, and online features, are forward
    passes whose bytes depend on it, see `torch_threads`)."""
    with torch_threads(threads):
        return _prepare_rows(source, prompt_ids, teacher)


def _prepare_rows(source: Any, prompt_ids: Sequence[str], teacher: Teacher) -> list[Row]:
    import torch

    order = list(prompt_ids)
    position = getattr(source, "order", None)
    if position is not None:      # online: read in capture order, so each forward runs once
        rank = {source.prompt_ids[i]: k for k, i in enumerate(position())}
        order.sort(key=lambda p: rank.get(p, len(rank)))
    rows = []
    for pid in order:
        s = source.get(pid)
        ids = torch.as_tensor(s.input_ids, dtype=torch.long)
        mask = torch.as_tensor(s.loss_mask).bool()
        final = s.final.float()
        # The teacher's argmax is needed at j where token j+1 is a completion token.
        need = torch.zeros_like(mask)
        need[:-1] = mask[1:]
        argmax = torch.full((ids.shape[0],), -1, dtype=torch.long)
        if need.any():
            argmax[need] = teacher.argmax(final[need])
        rows.append(Row(pid, ids, mask, s.aux.float(), final, argmax))
    by_id = {r.prompt_id: r for r in rows}
    return [by_id[p] for p in prompt_ids]


def plan_epoch(lengths: Sequence[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Rows shuffled by (seed, epoch), packed while rows x longest row stays under the budget."""
    order = list(range(len(lengths)))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        grown = max(longest, lengths[i])
        if cur and grown * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, grown = [], lengths[i]
        cur.append(i)
        longest = grown
    if cur:
        batches.append(cur)
    return batches


def collate(rows: Sequence[Row], t2d: Any, steps: int, device: str) -> dict[str, Any]:
    """Padded tensors, the query positions each row needs, and per-step loss masks over them."""
    import torch

    b = len(rows)
    t = max(r.input_ids.shape[0] for r in rows)
    h = rows[0].aux.shape[-1]
    ids = torch.zeros(b, t, dtype=torch.long)
    aux = torch.zeros(b, t, 3, h)
    final = torch.zeros(b, t, h)
    argmax = torch.full((b, t), -1, dtype=torch.long)
    valids, needed = [], []
    for k, r in enumerate(rows):
        n = r.input_ids.shape[0]
        ids[k, :n], aux[k, :n], final[k, :n], argmax[k, :n] = r.input_ids, r.aux, r.final, r.teacher_argmax
        v = loss_positions(r.loss_mask, r.teacher_argmax, t2d, steps)
        valids.append(v)
        needed.append(torch.nonzero(v.any(0)).flatten())
    s = max(1, max(len(x) for x in needed))
    qpos = torch.zeros(b, s, dtype=torch.long)
    qmask = torch.zeros(steps, b, s, dtype=torch.bool)
    for k, pos in enumerate(needed):
        if len(pos):
            qpos[k, :len(pos)] = pos
            qpos[k, len(pos):] = pos[-1]          # padding repeats a real position, never read
            qmask[:, k, :len(pos)] = valids[k][:, pos]
    return {"ids": ids.to(device), "aux": aux.to(device), "final": final.to(device),
            "argmax": argmax.to(device), "qpos": qpos.to(device), "qmask": qmask.to(device)}


# ------------------------------------------------------------ loss

def step_losses(model: Any, batch: dict[str, Any], teacher: Teacher, steps: int) -> tuple[list[Any], list[Any], list[int]]:
    """(loss_i tensors, correct_i counts, positions_i) for each TTT step of one batch."""
    import torch

    outs = model.ttt(batch["aux"], batch["ids"], steps, query_pos=batch["qpos"])
    losses, correct, counts = [], [], []
    for i, hidden in enumerate(outs):
        m = batch["qmask"][i]
        n = int(m.sum())
        counts.append(n)
        if n == 0:
            losses.append(hidden.sum() * 0.0)
            correct.append(torch.zeros((), device=hidden.device))
            continue
        rows, cols = m.nonzero(as_tuple=True)
        j = batch["qpos"][rows, cols] + 1 + i                      # the teacher's position
        logq = torch.log_softmax(model.logits(hidden[rows, cols]).float(), dim=-1)
        p = teacher.draft_probs(batch["final"][rows, j])
        losses.append(-(p * logq).sum(-1).mean())
        drafted = model.to_target(logq.argmax(-1))
        correct.append((drafted == batch["argmax"][rows, j]).sum().float())
    return losses, correct, counts


def lr_at(step: int, total: int, cfg: DrafterParams) -> float:
    warm = max(1, math.ceil(cfg.warmup_fraction * total)) if cfg.warmup_fraction > 0 else 0
    if warm and step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


# ------------------------------------------------------------ distributed

def world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed(device: str) -> bool:
    """Under torchrun (WORLD_SIZE > 1): join the process group; gloo on CPU, nccl on CUDA."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return True


def _all_reduce_mean(tensors: list[Any]) -> None:
    import torch.distributed as dist

    _, size = world()
    if size == 1:
        return
    for t in tensors:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t.div_(size)


# ------------------------------------------------------------ checkpoints

# Params that do not change what the optimizer steps compute: a checkpoint resumes across them.
# (threads does change it, in the last bits: a resume at other threads would give a drafter that no
# uninterrupted run gives, so it is part of the identity.)
NOT_IN_IDENTITY = ("device", "resume", "checkpoint_every", "export_dtype", "speculative_tokens")


def identity(vmap: VocabMap, cfg: DrafterParams, data_sha256: str, prompt_ids: Sequence[str], world_size: int) -> dict:
    """What a checkpoint must share with the run that resumes it."""
    import hashlib

    train = {k: v for k, v in as_dict(cfg).items() if k not in NOT_IN_IDENTITY}
    return {"vocab": vmap.describe(), "train": train, "data_sha256": data_sha256,
            "rows_sha256": hashlib.sha256("\n".join(prompt_ids).encode()).hexdigest(), "world_size": world_size}


def save_checkpoint(directory: Path, state: dict) -> None:
    import torch

    from draftgate.io import atomic_path

    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / CHECKPOINT) as tmp:
        torch.save(state, tmp)


def load_checkpoint(directory: Path | None, ident: dict, vmap: VocabMap) -> dict | None:
    import torch

    from draftgate.drafter.vocab import from_d2t

    if directory is None or not (directory / CHECKPOINT).is_file():
        return None
    state = torch.load(directory / CHECKPOINT, map_location="cpu", weights_only=False)
    old = state["identity"]
    v = old["vocab"]
    stored = from_d2t(state["model"]["d2t"].numpy(), v["target_vocab_size"], v["data_sha256"], v.get("selection", ""))
    require_same(stored, vmap, f"checkpoint {directory / CHECKPOINT}")
    for key in ("data_sha256", "rows_sha256", "train", "world_size"):
        if old.get(key) != ident.get(key):
            raise TrainError(f"checkpoint {directory / CHECKPOINT} was made with another {key} "
                             f"({old.get(key)!r} vs now {ident.get(key)!r}); delete the checkpoint to start "
                             "fresh, or set drafter.resume: false")
    return state


# ------------------------------------------------------------ the loop

def train(model: Any, rows: list[Row], teacher: Teacher, vmap: VocabMap, cfg: DrafterParams, *,
          device: str, data_sha256: str, checkpoint_dir: Path | None = None, resume: bool = True,
          stop_after: int | None = None, log: Callable[[str], None] = print) -> Result:
    """Train `model` in place on `cfg.threads` torch threads; returns the curve. `cfg` is the
    params' drafter section, the one source of its defaults (override fields with a params file,
    as tests/drafter_fixtures.py does, or dataclasses.replace, as bench/train.py does).
    `stop_after`: leave after that many optimizer steps (a checkpoint written), as a crash would;
    the next call resumes from it."""
    with torch_threads(cfg.threads):
        return _train(model, rows, teacher, vmap, cfg, device=device, data_sha256=data_sha256,
                      checkpoint_dir=checkpoint_dir, resume=resume, stop_after=stop_after, log=log)


def _train(model: Any, rows: list[Row], teacher: Teacher, vmap: VocabMap, cfg: DrafterParams, *,
           device: str, data_sha256: str, checkpoint_dir: Path | None, resume: bool, stop_after: int | None,
           log: Callable[[str], None]) -> Result:
    import torch

    rank, size = world()
    torch.manual_seed(cfg.seed)
    model.to(device).train()
    t2d = torch.as_tensor(vmap.t2d)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    lengths = [int(r.input_ids.shape[0]) for r in rows]
    plans = [plan_epoch(lengths, cfg.batch_tokens, cfg.seed, e) for e in range(cfg.epochs)]
    # Every rank takes the same number of steps: each epoch keeps a multiple of the world size.
    plans = [p[: len(p) - len(p) % size] if size > 1 else p for p in plans]
    if any(not p for p in plans):
        raise TrainError(f"{len(rows)} rows make fewer batches than the {size} processes; lower "
                         "drafter.batch_tokens or use fewer processes")
    per_epoch = [len(p) // size for p in plans]
    total = sum(per_epoch)
    ident = identity(vmap, cfg, data_sha256, [r.prompt_id for r in rows], size)
    curve: list[dict] = []
    step = 0
    state = load_checkpoint(checkpoint_dir, ident, vmap) if resume else None
    if state is not None:
        model.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["optimizer"])
        curve, step = state["curve"], state["step"]
        torch.set_rng_state(state["rng"])
        log(f"train: resuming at step {step} of {total} from {checkpoint_dir / CHECKPOINT}")
    resumed_from = step
    weights = step_weights(cfg)
    started = time.perf_counter()
    positions = 0
    done_in_call = 0

    def checkpoint() -> None:
        if checkpoint_dir is not None and rank == 0:
            save_checkpoint(checkpoint_dir, {
                "identity": ident, "model": {k: v.detach().cpu() for k, v in model.trainable_state().items()},
                "optimizer": opt.state_dict(), "curve": curve, "step": step, "rng": torch.get_rng_state()})

    global_step = 0
    for epoch, plan in enumerate(plans):
        for k in range(per_epoch[epoch]):
            if global_step < step:
                global_step += 1
                continue
            batch_rows = [rows[i] for i in plan[k * size + rank]]
            batch = collate(batch_rows, t2d, cfg.ttt_steps, device)
            lr = lr_at(step, total, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            losses, correct, counts = step_losses(model, batch, teacher, cfg.ttt_steps)
            loss = sum(w * l for w, l in zip(weights, losses))
            opt.zero_grad(set_to_none=False)
            loss.backward()
            grads = [p.grad for p in params]
            _all_reduce_mean(grads)
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            stats = torch.tensor([float(loss.detach())] + [float(l.detach()) for l in losses]
                                 + [float(c) for c in correct] + [float(n) for n in counts], dtype=torch.float64)
            _sum_stats(stats)
            k_ = cfg.ttt_steps
            row = {"step": step, "epoch": epoch, "lr": lr, "loss": stats[0].item() / size,
                   "grad_norm": float(norm)}
            for i in range(k_):
                row[f"loss_{i}"] = stats[1 + i].item() / size
            for i in range(k_):
                n = stats[1 + 2 * k_ + i].item()
                row[f"acc_{i}"] = stats[1 + k_ + i].item() / n if n else 0.0
            row["positions"] = int(stats[1 + 2 * k_].item())
            positions += counts[0]
            curve.append(row)
            step += 1
            global_step += 1
            done_in_call += 1
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < total:
                checkpoint()
            if stop_after is not None and done_in_call >= stop_after and step < total:
                checkpoint()
                return Result(curve, step, epoch, size, resumed_from, positions,
                              time.perf_counter() - started, _checksum(model))
    model.eval()
    return Result(curve, step, cfg.epochs, size, resumed_from, positions, time.perf_counter() - started,
                  _checksum(model))


def _sum_stats(stats: Any) -> None:
    import torch.distributed as dist

    _, size = world()
    if size > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)


def _checksum(model: Any) -> float:
    import torch

    with torch.no_grad():
        return float(sum(p.double().abs().sum() for p in model.parameters() if p.requires_grad))


def check_in_sync(checksum: float) -> None:
    """Data parallel: every rank must end with the same weights (gradients were averaged)."""
    import torch
    import torch.distributed as dist

    rank, size = world()
    if size == 1:
        return
    sums = [torch.zeros(1, dtype=torch.float64) for _ in range(size)]
    dist.all_gather(sums, torch.tensor([checksum], dtype=torch.float64))
    values = [float(s) for s in sums]
    if max(values) - min(values) > 1e-6 * max(1.0, abs(values[0])):
        raise TrainError(f"ranks ended with different weights (checksums {values}); gradient averaging failed")


def write_curve(rows: list[dict], loss_path: Path, acc_path: Path, steps: int) -> None:
    """DVC plots, one row per optimizer step: the loss (total and per TTT step) and the per-step
    accuracy. JSON arrays of objects: DVC plots them like CSV, and the drafter gate reads the
    curve as a table (gates read Parquet, JSONL and JSON)."""
    from draftgate.io import write_json

    def table(fields: list[str]) -> list[dict]:
        return [{k: (round(r[k], 6) if isinstance(r[k], float) else r[k]) for k in fields} for r in rows]

    write_json(loss_path, table(["step", "epoch", "lr", "loss"] + [f"loss_{i}" for i in range(steps)]))
    write_json(acc_path, table(["step"] + [f"acc_{i}" for i in range(steps)]))


def read_loss_curve(path: Path) -> list[float]:
    import json

    return [float(r["loss"]) for r in json.loads(Path(path).read_text(encoding="utf-8"))]


def loss_drop(losses: Sequence[float], window: int) -> float:
    """Mean of the first `window` losses over the mean of the last `window` (> 1: it fell)."""
    if len(losses) < 2:
        return 0.0
    w = max(1, min(window, len(losses) // 2))
    first, last = float(np.mean(losses[:w])), float(np.mean(losses[-w:]))
    return first / last if last > 0 else float("inf")
