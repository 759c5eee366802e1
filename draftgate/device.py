"""Which torch device a stage runs on: `auto` takes CUDA when torch sees it, else the CPU."""

from __future__ import annotations


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
