"""Hidden states in from SpecForge and gated training data out to SpecForge and speculators, each
proven by the library's own code in the side environment (interop/data.py; make interop).

In: SpecForge's offline files are written by SpecForge's own writer (its LocalFeatureStore dump:
torch.save of input_ids, loss_mask, hidden_state AFTER the final norm, aux_hidden_state [1,T,3H])
from the real SmolLM2's features, imported, and judged by the unchanged hidden gate, which
recomputes under the manifest's declared `final_state: after_norm`. Out: the export of a gated
hidden directory is read back by SpecForge's OfflineEagle3Dataset / feature reader / collator /
draft model's vocab loader and by speculators' ArrowDataset / packing loader / train CLI's vocab
lookup, and every tensor they return is held against what draftgate meant.

Under `make test` (DRAFTGATE_INTEROP=required) a missing side environment fails; a bare pytest
skips with the command to run. One side-environment call per direction serves every test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hidden_fixtures import write_gate
from test_hidden_gate_files import capture_features, greedy_world, run_hidden_gate, target, write_hidden_dir
from test_interop import ROOT, side_python


def failed(result):
    return {e["kwargs"].get("column", e["type"]) for e in result["expectations"] if not e["success"]}


def side(*args, timeout=300):
    proc = subprocess.run([str(side_python()), str(ROOT / "interop" / "data.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Three greedy SmolLM2 rows (+1 quarantined), now with a split column (the export takes
    drafter.splits), and their clean native features against that table."""
    import pyarrow.parquet as pq

    side_python()     # fail or skip before the slow part
    w = greedy_world(tmp_path_factory.mktemp("interop_data"))
    table = pq.read_table(w["tokens"])
    import pyarrow as pa

    table = table.append_column("split", pa.array(["train", "train", "heldout", "train"], pa.string()))
    pq.write_table(table, w["tokens"])
    w["clean"] = write_hidden_dir(w["root"] / "clean_split", w["features"], w["tokens"])
    return w


# ------------------------------------------------------------ in: SpecForge -> draftgate

@pytest.fixture(scope="module")
def side_run(world):
    """Both directions' side work in one call: SpecForge's own writer over the kept rows' features
    (file order 2, 0, 1), and each library's loaders over draftgate's export of the clean rows.
    SpecForge's final state is the norm's output of a float32 forward, stored in bfloat16 as SGLang's is."""
    import torch
    from safetensors.torch import load_file, save_file

    from draftgate.config import load_params
    from draftgate.exchange.export import export_data

    t = target()
    src = world["root"] / "specforge_src"
    src.mkdir()
    for i, f in enumerate(capture_features([world["kept"][k] for k in (2, 0, 1)], dtype="float32")):
        with torch.inference_mode():
            after = t.norm(f.final)
        t_len = len(f.input_ids)
        save_file({"input_ids": torch.tensor(f.input_ids, dtype=torch.long),
                   "loss_mask": torch.tensor(f.loss_mask, dtype=torch.long),
                   "hidden_state": after.to(torch.bfloat16).reshape(1, t_len, -1).contiguous(),
                   "aux_hidden_state": f.aux.to(torch.bfloat16).reshape(1, t_len, -1).contiguous()},
                  str(src / f"sample_{i}.safetensors"))
    export = world["root"] / "export"
    # The API with the session's target (the CLI, which loads its own, is tested below).
    export_data(world["clean"], world["tokens"], export, load_params(world["params"]), target=target())
    specforge, loaded = world["root"] / "specforge_out", world["root"] / "loaded"
    report = json.loads(side("--write-specforge", src, specforge, "--load", export, loaded).stdout)
    return {"specforge": specforge, "write_report": report["write_specforge"], "export": export,
            "report": report["load"], "loaded": load_file(str(loaded / "loaded.safetensors"))}


@pytest.fixture(scope="module")
def specforge_dir(side_run):
    assert side_run["write_report"] == {"written": 3, "read_back": 3,
                                        "keys": ["aux_hidden_state", "hidden_state", "input_ids", "loss_mask"]}
    return side_run["specforge"]


def import_specforge(world, hs, out):
    from stages.import_hidden import main

    return main(["--format", "specforge", "--params", str(world["params"]), "--hs", str(hs),
                 "--tokens", str(world["tokens"]), "--out", str(out)])


def test_specforge_files_import_and_pass_the_unchanged_hidden_gate(world, specforge_dir):
    out = world["root"] / "from_specforge"
    assert sorted(p.name for p in (specforge_dir / "rows_0-5000").iterdir()) == ["data_0.ckpt", "data_1.ckpt", "data_2.ckpt"]
    assert import_specforge(world, specforge_dir, out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["final_state"] == "after_norm" and manifest["source"]["format"] == "specforge"
    assert manifest["rows"] == 3 and manifest["layers"]["eagle3"] == [1, 14, 26]
    result = run_hidden_gate(out, world["tokens"], world["params"])
    assert failed(result) == set(), json.dumps(result["expectations"], indent=1)[:3000]
    report = result["computed"]["report"]
    assert report["explained_share"] == 1.0 and len(report["resampled"]) == 3


def test_corrupted_specforge_files_fail_the_gate_as_native_rows_do(world, specforge_dir):
    """Two bad files: one whose ids SGLang never ran for this table (SpecForge's files carry no
    prompt id, so it matches no kept row and that row has no features), one whose lowest aux
    layer is another layer's (a capture bug): the checks that catch them in native shards."""
    import torch

    bad = world["root"] / "specforge_bad"
    shutil.copytree(specforge_dir, bad)
    path = bad / "rows_0-5000" / "data_1.ckpt"
    data = torch.load(path, weights_only=True)
    data["input_ids"][-3] = (data["input_ids"][-3] + 1) % 49152
    torch.save(data, path)
    path = bad / "rows_0-5000" / "data_2.ckpt"
    data = torch.load(path, weights_only=True)
    h = data["hidden_state"].shape[-1]
    data["aux_hidden_state"][..., :h] = data["aux_hidden_state"][..., h:2 * h]     # slot 0 := slot 1
    torch.save(data, path)
    import gzip

    good = bad / "rows_0-5000" / "data_0.ckpt"                    # row p2, gzipped as SpecForge also reads it
    (good.parent / "data_0.ckpt.gz").write_bytes(gzip.compress(good.read_bytes()))
    good.unlink()
    out = world["root"] / "from_specforge_bad"
    assert import_specforge(world, bad, out) == 0                   # the importer converts; the gate judges
    assert json.loads((out / "manifest.json").read_text())["rows"] == 3
    result = run_hidden_gate(out, world["tokens"], world["params"])
    assert {"features_without_kept_row", "kept_row_without_features", "aux_not_this_row",
            "reextraction_differs"} <= failed(result)
    chain = json.dumps([e for e in result["expectations"] if e["kwargs"].get("column") == "aux_not_this_row"])
    assert '"p1' in chain and '"p2' not in chain      # data_2 holds p1 (written in order 2, 0, 1); data_0 is clean


def test_a_final_state_before_the_norm_declared_after_it_fails_the_chain_and_the_reextraction(world):
    """The declaration decides how the gate recomputes, and the recomputation checks it: native
    (pre-norm) features relabelled after_norm are caught by every row's last-layers chain and by
    the re-extraction."""
    relabelled = world["root"] / "relabelled"
    shutil.copytree(world["clean"], relabelled)
    m = json.loads((relabelled / "manifest.json").read_text())
    m["final_state"] = "after_norm"
    (relabelled / "manifest.json").write_text(json.dumps(m))
    assert {"aux_not_this_row", "reextraction_differs"} <= failed(run_hidden_gate(relabelled, world["tokens"], world["params"]))


def test_a_manifest_without_a_known_final_state_fails(world):
    unknown = world["root"] / "unknown_final"
    shutil.copytree(world["clean"], unknown)
    m = json.loads((unknown / "manifest.json").read_text())
    m["final_state"] = "post_norm"
    (unknown / "manifest.json").write_text(json.dumps(m))
    assert "final_state_known" in failed(run_hidden_gate(unknown, world["tokens"], world["params"]))


def test_training_refuses_an_after_norm_import(world, specforge_dir, tmp_path):
    from draftgate.config import load_params
    from draftgate.drafter.run import RunError, setup

    out = world["root"] / "from_specforge"
    if not (out / "manifest.json").is_file():
        assert import_specforge(world, specforge_dir, out) == 0
    with pytest.raises(RunError, match="final_state 'after_norm'.*export these rows to SpecForge"):
        setup(load_params(world["params"]), out, world["tokens"], target=target())


# ------------------------------------------------------------ out: draftgate -> SpecForge, speculators

@pytest.fixture(scope="module")
def exported(side_run):
    return side_run["export"], side_run["report"], side_run["loaded"]


def test_the_export_takes_the_training_rows_in_table_order_and_writes_its_record_last(world, exported):
    out, _, _ = exported
    doc = json.loads((out / "export.json").read_text())
    assert doc["prompt_ids"] == ["p0", "p1"] and doc["dropped"] == {"split_not_trained": 1}   # p2 is heldout
    assert doc["final_state_source"] == "before_norm" and doc["draft_vocab"]["size"] == 2048
    from draftgate.io import file_sha256

    assert all(file_sha256(out / name) == sha for name, sha in doc["files"].items())


def test_specforges_loaders_read_the_export_as_draftgate_means_it(world, exported):
    import torch

    out, report, loaded = exported
    sf = report["specforge"]
    assert sf["items"] == sf["files"] == sf["refs"] == 2 and sf["reader_matches_dataset"]
    assert sf["draft_model"] == "LlamaForCausalLMEagle3" and sf["vocab_mapping_loaded"]
    t = target()
    for i, f in enumerate(world["features"][:2]):
        n = len(f.input_ids)
        mask = torch.tensor(f.loss_mask)
        mask[-1] = 0                                          # SpecForge's own: no target after the last token
        assert torch.equal(loaded[f"specforge.{i}.input_ids"], torch.tensor([f.input_ids]))
        assert torch.equal(loaded[f"specforge.{i}.loss_mask"], mask[None])
        assert torch.equal(loaded[f"specforge.{i}.hidden_state"], f.aux.reshape(1, n, -1))   # its name for the aux input
        target_state = loaded[f"specforge.{i}.target"][0]
        with torch.inference_mode():
            assert torch.equal(target_state, t.norm(f.final.float()).to(torch.bfloat16))
            # SpecForge's TargetHead is the LM head alone: over the exported state it gives the
            # greedy completion the rows hold.
            logits = t.lm_head(target_state.float())
        nxt = torch.nonzero(torch.tensor(f.loss_mask[1:]) != 0).flatten()
        assert torch.equal(logits[nxt].argmax(-1), torch.tensor(f.input_ids)[nxt + 1])


def test_speculators_loaders_read_the_export_as_draftgate_means_it(world, exported):
    import numpy as np
    import torch

    from draftgate.drafter.vocab import vocab_from_tokens

    out, report, loaded = exported
    sp = report["speculators"]
    assert sp["items"] == 2 and sp["draft_vocab_size"] == 2048
    assert sp["loader_tokens"] == sum(len(f.input_ids) for f in world["features"][:2])
    for i, f in enumerate(world["features"][:2]):
        n = len(f.input_ids)
        assert torch.equal(loaded[f"speculators.{i}.input_ids"], torch.tensor(f.input_ids))
        assert torch.equal(loaded[f"speculators.{i}.loss_mask"], torch.tensor(f.loss_mask))
        assert torch.equal(loaded[f"speculators.{i}.hidden_states"], f.aux.reshape(n, -1))
        assert torch.equal(loaded[f"speculators.{i}.verifier_last_hidden_states"], f.final)   # before the norm
    vmap, _, _ = vocab_from_tokens(world["tokens"], ["train"], 2048, target().vocab_size)
    for lib in ("specforge", "speculators"):
        assert np.array_equal(loaded[f"{lib}.d2t"].numpy(), vmap.d2t), lib
        assert np.array_equal(loaded[f"{lib}.t2d"].numpy(), vmap.t2d), lib


def test_the_export_refuses_to_run_past_a_failed_hidden_gate(world, tmp_path, capsys):
    from stages.export_data import main

    gate = write_gate(tmp_path / "gate.json", success=False)
    assert main(["--params", str(world["params"]), "--hidden", str(world["clean"]), "--tokens", str(world["tokens"]),
                 "--gate", str(gate), "--out", str(tmp_path / "out")]) == 1
    assert "gate" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_an_after_norm_import_exports_to_specforge_only(world, specforge_dir, tmp_path, capsys):
    from stages.export_data import main

    src = world["root"] / "from_specforge"
    if not (src / "manifest.json").is_file():
        assert import_specforge(world, specforge_dir, src) == 0
    gate = write_gate(tmp_path / "gate.json")
    args = ["--params", str(world["params"]), "--hidden", str(src), "--tokens", str(world["tokens"]),
            "--gate", str(gate), "--out", str(tmp_path / "out")]
    assert main(args) == 1 and "--formats specforge only" in capsys.readouterr().err
    assert main(args + ["--formats", "specforge"]) == 0
    assert sorted(p.name for p in (tmp_path / "out" / "specforge" / "hidden_states").iterdir()) == \
        ["data_000000.ckpt", "data_000001.ckpt"]


def test_the_speculators_format_needs_its_dataset_and_specforge_does_not():
    from stages.import_hidden import parse_args

    base = ["--params", "p.yaml", "--hs", "hs", "--tokens", "t.parquet", "--out", "o"]
    with pytest.raises(SystemExit) as e:
        parse_args(base)
    assert e.value.code == 2
    assert parse_args(["--format", "specforge", *base]).dataset is None
