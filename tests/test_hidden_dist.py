"""torchrun: two CPU ranks on gloo split the shards and write the artifact one process writes:
the same shards (names, rows, ids, sizes), the same index, and features equal within one bf16 step.

Not byte for byte: two processes can sum a matrix product in a different order (CPU GEMM kernels
pick their blocking by memory alignment), which moves a float32 value by ~1e-6 and, now and then,
its bfloat16 rounding by one step (docs/hidden-states.md, "Determinism")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftgate.hidden.reader import OfflineFeatures

from hidden_fixtures import metrics_of, stage_args, token_rows, write_gate, write_params, write_tokens

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun is not installed beside this Python")
def test_two_gloo_ranks_write_what_one_process_writes(tmp_path, smollm2_tok):
    write_tokens(tmp_path / "tokens.parquet", token_rows(smollm2_tok, 6))
    write_gate(tmp_path / "gate.json")
    params = write_params(tmp_path / "params.yaml", dtype="bfloat16", shard_max_mb=0.5, batch_tokens=200)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    two = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "stages.hidden",
                          *stage_args(tmp_path, tmp_path / "two", params)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    from stages.hidden import main     # one process: this one (a third process start bought nothing)

    assert main(stage_args(tmp_path, tmp_path / "one", params)) == 0

    merged = json.loads((tmp_path / "two" / "manifest.json").read_text())
    single = json.loads((tmp_path / "one" / "manifest.json").read_text())
    assert metrics_of(tmp_path / "two")["world_size"] == 2 and len(merged["shards"]) >= 2
    assert merged["rows"] == single["rows"] == 6
    drop = ("sha256",)
    assert [{k: v for k, v in s.items() if k not in drop} for s in merged["shards"]] == \
        [{k: v for k, v in s.items() if k not in drop} for s in single["shards"]]
    assert (tmp_path / "two" / "index.parquet").read_bytes() == (tmp_path / "one" / "index.parquet").read_bytes()
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == \
        sorted(["index.parquet", "manifest.json"] + [s["name"] for s in merged["shards"]])
    two_f = OfflineFeatures(tmp_path / "two", tmp_path / "tokens.parquet", verify_hashes=True)
    one_f = OfflineFeatures(tmp_path / "one", tmp_path / "tokens.parquet", verify_hashes=True)
    for a, b in zip(two_f, one_f):
        assert a.prompt_id == b.prompt_id and torch.equal(a.input_ids, b.input_ids)
        assert torch.equal(a.loss_mask, b.loss_mask)
        torch.testing.assert_close(a.aux.float(), b.aux.float(), rtol=2 ** -7, atol=1e-3)
        torch.testing.assert_close(a.final.float(), b.final.float(), rtol=2 ** -7, atol=1e-3)
