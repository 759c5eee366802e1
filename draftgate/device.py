"""Which torch device a stage runs on (`auto` takes CUDA when torch sees it, else the CPU), and on
how many CPU threads."""

from __future__ import annotations

import contextlib
from typing import Iterator


class DeviceError(RuntimeError):
    """A device the machine does not have; the message names the param and the fix."""


def resolve_device(device: str, param: str) -> str:
    """`param`: the params key that chose `device` (e.g. "serve.device"), for the error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"{param} is 'cuda' but torch sees no CUDA device; set {param}: auto or cpu")
    return device


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `n` inside, restored after (the threads param of the hidden,
    repair, train and eval stages).

    CPU kernels split their reductions by thread, so a forward's last bits depend on the count:
    the demo's 92 training steps ended at loss 19.903 with 2 threads and 19.921 with 1 (eval
    acceptance 1.218 vs 1.209); the repair table's margins and the hidden shards' bytes differ
    too, while runs at equal threads are bit-identical. torch's default is the core count (and
    OMP_NUM_THREADS), so another machine, or a shell that set the variable, would quietly write
    other bytes and DVC would rerun everything downstream: the count is a param (fixed, not
    "auto"), recorded with the others in each stage's metrics, and a change reruns the stage.
    The default 2 is what the committed run used (this 2-core machine's default). None leaves
    torch's setting alone (a caller that sets its own, as the benches do); on CUDA the count only
    moves the host-side work."""
    import torch

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
