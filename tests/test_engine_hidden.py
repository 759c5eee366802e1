"""`hidden.backend: vllm`: the real vLLM prefills the rows, draftgate's KV connector hands over the
states, and the hidden stage writes the very layout the in-process path writes; the hidden gate
stays the second opinion and fails a connector that captures the wrong layer or shifts positions.

One engine start for the file (module scope, eager): three greedy SmolLM2 rows (+1 quarantined)
extracted by the stage with the engine into two shards. The in-process run of the same rows is the
reference (docs/engines.md, "Hidden states" records the measured differences).
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
import yaml

from engine_fixtures import engine_python
from hidden_fixtures import metrics_of, stage_args, write_gate
from test_hidden_gate_files import FeatureRow, greedy_world, run_hidden_gate, write_hidden_dir

# Three ~56-token rows of (3 + 1) x 576 bf16 features (~260 kB each): two shards.
SHARD_MAX_MB = 0.6


def stage_params(world, name: str, **hidden):
    params = yaml.safe_load(world["params"].read_text())
    params["hidden"] = {**params.get("hidden", {}), "device": "cpu", "threads": 1, "shard_max_mb": SHARD_MAX_MB,
                        **hidden}
    path = world["root"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def run_stage(world, name: str, params):
    """The stage as dvc.yaml runs it: from its workspace, every path relative (the engine runs
    elsewhere: a relative path handed to it would name nothing)."""
    from stages.hidden import main

    root = world["root"]
    out = root / name
    args = [a.replace(f"{root}{os.sep}", "") for a in stage_args(root, out, params)]
    assert str(root) not in " ".join(args)
    here = os.getcwd()
    os.chdir(root)
    try:
        return main(args), out
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The greedy rows, the stage run once through vLLM (the file's one engine start) and once in process."""
    engine_python()        # a missing engine environment fails under make test (DRAFTGATE_ENGINE=required)
    world = greedy_world(tmp_path_factory.mktemp("engine_hidden"))
    write_gate(world["root"] / "gate.json")
    world["vllm_params"] = stage_params(world, "vllm", backend="vllm")
    rc, world["vllm"] = run_stage(world, "vllm", world["vllm_params"])
    assert rc == 0
    world["vllm_metrics"] = metrics_of(world["vllm"])
    rc, world["in_process"] = run_stage(world, "in_process", stage_params(world, "in_process"))
    assert rc == 0
    return world


def gate(world, hidden_dir):
    return run_hidden_gate(hidden_dir, world["tokens"], world["vllm_params"])


def failed(result) -> set[str]:
    return {e["kwargs"].get("column", e["type"]) for e in result["expectations"] if not e["success"]}


def shards(out) -> dict:
    from safetensors import safe_open

    found = {}
    for path in sorted(out.glob("shard-*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            found[path.name] = ({k: f.get_tensor(k) for k in f.keys()}, f.metadata())
    return found


def feature_rows(out) -> list[FeatureRow]:
    """The engine's stored rows, as the gate tests' writer takes them."""
    rows = []
    for tensors, meta in shards(out).values():
        offsets = tensors["row_offsets"].tolist()
        for k, pid in enumerate(json.loads(meta["prompt_ids"])):
            a, b = offsets[k], offsets[k + 1]
            rows.append(FeatureRow(pid, tensors["input_ids"][a:b].tolist(), tensors["loss_mask"][a:b].tolist(),
                                   tensors["aux"][a:b].clone(), tensors["final"][a:b].clone()))
    return rows


def corrupted(world, name: str, rows: list[FeatureRow]):
    out = world["root"] / name
    shutil.rmtree(out, ignore_errors=True)
    return write_hidden_dir(out, rows, world["tokens"])


def test_the_engine_writes_the_in_process_layout_with_the_tokens_ids_exactly(world):
    import pyarrow.parquet as pq

    engine, ours = world["vllm"], world["in_process"]
    assert sorted(p.name for p in engine.iterdir()) == sorted(p.name for p in ours.iterdir())   # no spool left
    assert len(list(engine.glob("shard-*.safetensors"))) == 2
    assert pq.read_table(engine / "index.parquet").equals(pq.read_table(ours / "index.parquet"))
    m_engine, m_ours = (json.loads((d / "manifest.json").read_text()) for d in (engine, ours))
    assert m_engine["backend"] == "vllm" and m_engine["engine"].startswith("vllm")
    same = ("format", "rows", "tokens", "tokens_sha256", "model", "tokenizer_fingerprint", "dtype", "layers",
            "final_state", "feature_bytes_per_token", "plan")
    assert {k: m_engine[k] for k in same} == {k: m_ours[k] for k in same}
    assert [(s["name"], s["rows"], s["tokens"], s["bytes"]) for s in m_engine["shards"]] == \
        [(s["name"], s["rows"], s["tokens"], s["bytes"]) for s in m_ours["shards"]]
    for (e, e_meta), (o, o_meta) in zip(shards(engine).values(), shards(ours).values()):
        assert e_meta == o_meta
        for key in ("input_ids", "loss_mask", "row_offsets"):
            assert e[key].equal(o[key]), key
        for key in ("aux", "final"):
            ref = o[key].float()
            rel = ((e[key].float() - ref).norm() / ref.norm()).item()
            assert rel < 1e-3, (key, rel)        # measured <= 5.1e-5: fp32 forwards, both rounded to bf16
    figures = world["vllm_metrics"]
    assert figures["device"].startswith("vllm") and figures["computed_shards"] == 2
    assert figures["bytes_ratio"] == metrics_of(ours)["bytes_ratio"]


def test_the_hidden_gate_passes_the_engines_shards(world):
    result = gate(world, world["vllm"])
    assert failed(result) == set(), json.dumps(result["expectations"], indent=1)[:3000]
    assert result["computed"]["report"]["explained_share"] == 1.0


def test_the_gate_fails_a_connector_that_puts_a_layer_in_anothers_slot(world):
    rows = copy.deepcopy(feature_rows(world["vllm"]))
    for r in rows:    # what a connector ignoring vLLM's ascending capture order stores for layers [14, 1, 26]
        r.aux = r.aux[:, [1, 0, 2]].contiguous()
    assert "reextraction_differs" in failed(gate(world, corrupted(world, "wrong_layer", rows)))


def test_the_gate_fails_a_connector_that_shifts_positions_by_one(world):
    import torch

    rows = copy.deepcopy(feature_rows(world["vllm"]))
    for r in rows:    # position t holds the state of t - 1 (a slot mapping one off)
        r.aux = torch.cat([r.aux[:1], r.aux[:-1]])
        r.final = torch.cat([r.final[:1], r.final[:-1]])
    assert {"greedy_explained_share", "reextraction_differs"} <= failed(gate(world, corrupted(world, "shifted", rows)))


def test_a_rerun_resumes_every_shard_without_starting_the_engine(world):
    before = {p.name: p.read_bytes() for p in world["vllm"].iterdir()}
    rc, out = run_stage(world, "vllm", world["vllm_params"])
    assert rc == 0
    figures = metrics_of(out)
    assert (figures["resumed_shards"], figures["computed_shards"], figures["extracted_tokens"]) == (2, 0, 0)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_missing_engine_environment_fails_naming_the_python_and_the_fix(world, capsys):
    params = yaml.safe_load(world["vllm_params"].read_text())
    params["engine"] = {**params.get("engine", {}), "python": str(world["root"] / "no-such-python")}
    path = world["root"] / "no_engine.yaml"
    path.write_text(yaml.safe_dump(params))
    rc, out = run_stage(world, "no_engine", path)
    assert rc == 1
    err = capsys.readouterr().err
    assert "no-such-python" in err and "vLLM" in err
    assert not (out / "manifest.json").exists()


def test_an_engine_whose_shutdown_fails_after_every_row_was_verified_is_noted_with_its_log_not_failed(tmp_path):
    from draftgate.hidden.vllm_backend import exit_note

    log = tmp_path / "engine.log"
    log.write_text("shard-00001 done\nRuntimeError: worker died during shutdown\n")
    assert exit_note(0, log) is None
    note = exit_note(-11, log)
    assert "exited with status -11 after every row was written and verified" in note
    assert note.endswith("RuntimeError: worker died during shutdown")     # the spool (and its log) goes next
    assert "was still running 30 s later and was stopped" in exit_note(None, log)
