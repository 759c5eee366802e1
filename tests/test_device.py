"""Devices: auto takes CUDA when torch sees it; asking for CUDA without one names the param to fix."""

from __future__ import annotations

import pytest
import torch

from draftgate.device import DeviceError, resolve_device


def test_auto_is_cuda_only_when_torch_sees_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", "serve.device") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto", "serve.device") == "cuda"


def test_cuda_without_a_gpu_names_the_param_that_asked_for_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"eval\.device is 'cuda'.*set eval\.device: auto or cpu"):
        resolve_device("cuda", "eval.device")
    assert resolve_device("cpu", "eval.device") == "cpu"


def test_the_drafter_stage_reports_it_as_its_own_error(monkeypatch):
    from dataclasses import replace
    from pathlib import Path

    from draftgate.config import load_params
    from draftgate.drafter.run import RunError, setup

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    params = replace(params, drafter=replace(params.drafter, device="cuda"))
    with pytest.raises(RunError, match="drafter.device is 'cuda'"):
        setup(params, "missing-hidden", "missing-tokens.parquet")
