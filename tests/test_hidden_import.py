"""The speculators importer: files shaped as vLLM's extraction path writes them (per-sample
hs_<i>.safetensors with token_ids and hidden_states [T, 4, H], a save_to_disk dataset of ids and
loss masks) become a draftgate.hidden/1 directory that the hidden gate validates like the stage's.

The speculators files are written here from the real SmolLM2's own forward pass: aux slots from
HF output_hidden_states at vLLM's layer ids [2, 15, 27] (= our [1, 14, 26]), the last slot the
input of the final norm (speculators stores the final state before the norm).
"""

from __future__ import annotations

import json

import pytest

from test_hidden_gate_files import greedy_world, run_hidden_gate, target

VLLM_LAYERS = [2, 15, 27]


def speculators_files(root, rows, order, layers=VLLM_LAYERS, name=""):
    """hs_<i>.safetensors for dataset position i (rows taken in `order`, as a shuffling
    preprocessor would), and the dataset folder (Arrow IPC stream, as save_to_disk writes)."""
    import pyarrow as pa
    import torch
    from safetensors.torch import save_file

    t = target()
    hs_dir, ds_dir = root / f"hidden_states{name}", root / f"dataset{name}"
    hs_dir.mkdir()
    ds_dir.mkdir()
    for i, k in enumerate(order):
        ids = torch.tensor(rows[k]["input_ids"], dtype=torch.long)
        seen = {}
        handle = t.norm.register_forward_pre_hook(lambda _m, args: seen.update(final=args[0]))
        try:
            with torch.inference_mode():
                out = t.base(input_ids=ids[None], output_hidden_states=True, use_cache=False)
        finally:
            handle.remove()
        stack = [out.hidden_states[j][0] for j in layers] + [seen["final"][0]]
        save_file({"token_ids": ids, "hidden_states": torch.stack(stack, dim=1).to(torch.bfloat16).contiguous()},
                  str(hs_dir / f"hs_{i}.safetensors"))
    table = pa.table({"input_ids": [rows[k]["input_ids"] for k in order],
                      "loss_mask": [rows[k]["loss_mask"] for k in order],
                      "seq_len": [len(rows[k]["input_ids"]) for k in order]})
    with pa.OSFile(str(ds_dir / "data-00000-of-00001.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    (ds_dir / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    return hs_dir, ds_dir


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = greedy_world(tmp_path_factory.mktemp("hidden_import"))
    w["hs"], w["dataset"] = speculators_files(w["root"], w["kept"], order=[2, 0, 1])
    return w


def import_into(world, out, hs=None):
    from stages.import_hidden import main

    return main(["--params", str(world["params"]), "--hs", str(hs or world["hs"]), "--dataset",
                 str(world["dataset"]), "--tokens", str(world["tokens"]), "--out", str(out),
                 "--vllm-layers", ",".join(map(str, VLLM_LAYERS))])


def failed(result):
    return {e["kwargs"].get("column", e["type"]) for e in result["expectations"] if not e["success"]}


def test_imported_speculators_features_pass_the_hidden_gate(world):
    out = world["root"] / "imported"
    assert import_into(world, out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["layers"]["eagle3"] == [1, 14, 26] and manifest["source"]["format"] == "speculators"
    assert manifest["rows"] == 3
    result = run_hidden_gate(out, world["tokens"], world["params"])
    assert failed(result) == set(), json.dumps(result["expectations"], indent=1)[:3000]
    assert result["computed"]["report"]["explained_share"] == 1.0


def test_a_sample_whose_ids_disagree_with_the_tokens_table_fails_the_gate(world):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    hs = world["root"] / "hidden_states_bad"
    shutil.copytree(world["hs"], hs)
    data = load_file(str(hs / "hs_1.safetensors"))
    data["token_ids"][-3] = (data["token_ids"][-3] + 1) % 49152   # vLLM answered for other ids
    save_file({k: v.contiguous() for k, v in data.items()}, str(hs / "hs_1.safetensors"))
    out = world["root"] / "imported_bad"
    assert import_into(world, out, hs) == 0     # the importer converts; the gate judges
    assert "ids_differ" in failed(run_hidden_gate(out, world["tokens"], world["params"]))


def test_features_vllm_captured_at_other_layers_fail_the_reextraction(world):
    # vLLM launched with [3, 15, 27] while the params (and the import) expect [2, 15, 27]:
    # the manifest then claims the expected layers, and only the gate's own forward passes can tell.
    hs, dataset = speculators_files(world["root"], world["kept"], order=[0, 1, 2], layers=[3, 15, 27], name="_l3")
    out = world["root"] / "imported_wrong_layers"
    from stages.import_hidden import main

    assert main(["--params", str(world["params"]), "--hs", str(hs), "--dataset", str(dataset),
                 "--tokens", str(world["tokens"]), "--out", str(out)]) == 0
    # Every row's first-layers check sees it too (the lowest aux slot is not layer 2 of this row).
    assert failed(run_hidden_gate(out, world["tokens"], world["params"])) == {"reextraction_differs", "aux_not_this_row"}
