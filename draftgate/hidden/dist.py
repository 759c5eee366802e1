"""torchrun support: which rank this is, a process group for barriers, nothing else.

The ranks never exchange tensors: each writes its own shards (the plan deals them round-robin),
and rank 0 merges the index and manifest after a barrier (docs/hidden-states.md, "torchrun").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def device(self, device: str, param: str = "hidden.device") -> str:
        """`auto`/`cuda` under torchrun: this rank's own GPU."""
        from draftgate.device import resolve_device

        dev = resolve_device(device, param)
        return f"cuda:{self.local_rank}" if dev == "cuda" and self.distributed else dev


def world() -> World:
    return World(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                 int(os.environ.get("LOCAL_RANK", 0)))


def init(w: World, device: str, timeout_s: float = 3600.0) -> None:
    """A process group for barriers: NCCL between GPUs, gloo on CPUs (the tests run 2 CPU ranks)."""
    if not w.distributed:
        return
    import torch.distributed as dist

    backend = "nccl" if device.startswith("cuda") else "gloo"
    kwargs = {"device_id": __import__("torch").device(device)} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)


def barrier(w: World) -> None:
    if w.distributed:
        import torch.distributed as dist

        dist.barrier()


def broadcast_ok(w: World, ok: bool) -> bool:
    """Every rank learns whether all ranks succeeded (a failed rank must not leave the others waiting)."""
    if not w.distributed:
        return ok
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def finish(w: World) -> None:
    if w.distributed:
        import torch.distributed as dist

        dist.destroy_process_group()


def gather(w: World, obj: object) -> list[object]:
    """Every rank's `obj` (small: stats), in rank order."""
    if not w.distributed:
        return [obj]
    import torch.distributed as dist

    out: list[object] = [None] * w.size
    dist.all_gather_object(out, obj)
    return out
