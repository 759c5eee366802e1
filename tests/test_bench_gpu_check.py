"""bench/gpu_check.py never pretends: without a CUDA GPU and vLLM's CUDA build it exits 2 naming
what is missing, and `make bench` (which runs on CPU) leaves it out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def no_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: run `make gpu-check` itself")


def test_without_cuda_it_exits_2_and_says_what_it_needs(capsys, tmp_path):
    from bench.gpu_check import main

    out = tmp_path / "gpu_check.json"
    assert main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "sees no CUDA device" in err and "ENGINE_PYTHON=" in err and "pip install vllm" in err
    assert not out.exists()


def test_an_engine_python_without_vllm_is_named(capsys):
    from bench.gpu_check import main

    assert main(["--engine-python", sys.executable]) == 2
    assert f"{sys.executable}: vLLM is not installed there" in capsys.readouterr().err


def test_the_cli_exits_2_and_make_bench_leaves_it_out():
    out = subprocess.run([sys.executable, "-m", "bench.gpu_check"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "cannot run here" in out.stderr
    planned = subprocess.run(["make", "-n", "bench"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "bench.engine_hidden" in planned and "bench.gpu_check" not in planned
