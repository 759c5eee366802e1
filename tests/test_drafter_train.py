"""Training on real SmolLM2 features: the loss falls, TTT weights apply, resume continues the
curve, a map from other data is refused, and two torchrun processes on gloo train as one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drafter_fixtures import curve, metrics, shared_target, shared_workspace, train_into


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return shared_workspace(tmp_path_factory)


@pytest.fixture(scope="module")
def trained(ws, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    assert train_into(ws, out, ws.params()) == 0
    return out


def test_training_on_real_features_lowers_the_loss(trained):
    rows = curve(trained / "train_loss.json")
    first = sum(r["loss"] for r in rows[:3]) / 3
    last = sum(r["loss"] for r in rows[-3:]) / 3
    assert last < first / 1.2, (first, last)
    m = metrics(trained)
    assert m["steps"] == len(rows) and m["loss_drop"] > 1.2
    acc = curve(trained / "train_acc.json")
    assert acc[-1]["acc_0"] > acc[0]["acc_0"]
    assert not (trained / "ckpt").exists()          # a finished, exported run leaves no checkpoint


def test_the_loss_is_the_steps_losses_weighted_by_the_configured_decay(trained, ws, tmp_path):
    for row in curve(trained / "train_loss.json"):
        assert row["loss"] == pytest.approx(sum(0.8 ** i * row[f"loss_{i}"] for i in range(3)), rel=1e-4)
    out = tmp_path / "decay"
    assert train_into(ws, out, ws.params("p_decay.yaml", ttt_decay=0.5, epochs=1)) == 0
    for row in curve(out / "train_loss.json"):
        assert row["loss"] == pytest.approx(row["loss_0"] + 0.5 * row["loss_1"] + 0.25 * row["loss_2"], rel=1e-4)


def test_online_features_train_the_same_as_offline_shards(trained, tmp_path_factory, tmp_path):
    online = shared_workspace(tmp_path_factory, "drafter_ws_online", mode="online")
    assert not list(online.hidden.glob("shard-*"))             # online: manifest and index only
    out = tmp_path / "online"
    assert train_into(online, out, online.params()) == 0
    a, b = curve(out / "train_loss.json"), curve(trained / "train_loss.json")
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-3)


def test_a_resumed_run_continues_the_same_curve(ws, trained, tmp_path):
    out = tmp_path / "resumed"
    params = ws.params()
    assert train_into(ws, out, params, stop_after=5) == 0
    assert (out / "ckpt" / "state.pt").is_file() and not (out / "drafter").exists()
    assert train_into(ws, out, params) == 0
    resumed, straight = curve(out / "train_loss.json"), curve(trained / "train_loss.json")
    assert len(resumed) == len(straight)
    for a, b in zip(resumed, straight):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
    assert metrics(out)["resumed_from_step"] == 5


def test_a_checkpoint_with_other_params_is_refused(ws, tmp_path):
    from draftgate.drafter.run import RunError

    out = tmp_path / "other"
    assert train_into(ws, out, ws.params(), stop_after=2) == 0
    with pytest.raises(RunError, match="another train"):
        train_into(ws, out, ws.params("p_lr.yaml", lr=0.01))
    # Other threads would continue the curve in other last bits: a drafter no uninterrupted run gives.
    with pytest.raises(RunError, match="another train"):
        train_into(ws, out, ws.params("p_threads.yaml", threads=2))


def test_a_second_run_writes_the_same_bytes_and_records_its_threads(ws, trained, tmp_path):
    import json

    out = tmp_path / "again"
    assert train_into(ws, out, ws.params()) == 0
    first, second = (sorted(p.relative_to(d / "drafter") for p in (d / "drafter").rglob("*") if p.is_file())
                     for d in (trained, out))
    assert first == second and len(first) == 8
    assert [str(p) for p in first if (trained / "drafter" / p).read_bytes() != (out / "drafter" / p).read_bytes()] == []
    assert (trained / "train_loss.json").read_bytes() == (out / "train_loss.json").read_bytes()
    details = json.loads((trained / "metrics" / "train.details.json").read_text())
    assert details["params"]["drafter"]["threads"] == 1
    info = json.loads((trained / "drafter" / "sglang" / "draftgate.json").read_text())
    assert info["train"]["params"]["threads"] == 1
    # Nothing of this machine inside the artifact: no temp folder, no cache path of the target.
    from draftgate import cache

    for p in first:
        if p.suffix == ".json":
            text = (trained / "drafter" / p).read_text()
            assert [s for s in (str(ws.root), str(trained), str(cache.root())) if s in text] == [], p
    assert info["target"]["path"] == "embedded:smollm2-135m-instruct"


def test_torch_runs_on_the_given_threads_inside_and_on_its_own_after():
    import torch

    from draftgate.device import torch_threads

    before = torch.get_num_threads()
    with torch_threads(3):
        assert torch.get_num_threads() == 3
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


def test_changed_data_with_an_old_map_is_refused_naming_both_hashes(ws, trained, tmp_path_factory, tmp_path):
    from draftgate.drafter.run import RunError
    from draftgate.io import file_sha256

    other = shared_workspace(tmp_path_factory, "drafter_ws_other", n_rows=5)
    # Warm start from the export trained on the 8-row data, now on 5 rows: another map.
    params = other.params("warm.yaml", init_from=str(trained / "drafter" / "sglang"))
    with pytest.raises(RunError) as e:
        train_into(other, tmp_path / "warm", params)
    assert file_sha256(ws.tokens) in str(e.value) and file_sha256(other.tokens) in str(e.value)
    # Resume: the 8-row run's checkpoint meeting the 5-row data.
    out = tmp_path / "resume_other"
    assert train_into(ws, out, ws.params(), stop_after=2) == 0
    with pytest.raises(RunError) as e:
        train_into(other, out, other.params())
    assert file_sha256(ws.tokens) in str(e.value) and file_sha256(other.tokens) in str(e.value)


def test_training_refuses_to_start_when_the_hidden_gate_failed(ws, tmp_path):
    from hidden_fixtures import write_gate

    from stages.train import main

    gate = write_gate(tmp_path / "failed.json", success=False)
    args = ws.stage_args(ws.params(), tmp_path / "out")
    args[args.index("--gate") + 1] = str(gate)
    assert main(args) == 1
    assert not (tmp_path / "out" / "drafter").exists()


def test_two_torchrun_processes_on_gloo_train_data_parallel(ws, tmp_path):
    from draftgate.drafter.export import check_export

    out = tmp_path / "ddp"
    params = ws.params("ddp.yaml", batch_tokens=128, epochs=3)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "stages.train", *ws.stage_args(params, out)]
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    m = metrics(out)
    assert m["world_size"] == 2
    rows = curve(out / "train_loss.json")
    assert len(rows) == m["steps"] and rows[-1]["loss"] < rows[0]["loss"]
    assert check_export(out / "drafter" / "speculators", "vllm") == []
