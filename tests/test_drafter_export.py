"""Exports: each layout reloads as trained by its engine's naming rules, and the drafter gate
(recomputed from the files) fails a renamed key, missing aux layer ids or tied embeddings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from drafter_fixtures import run_drafter_gate, trained, ws  # noqa: F401 (the module's fixtures)
from draftgate.drafter import export as ex


def layers(ws) -> dict:
    return json.loads((ws.hidden / "manifest.json").read_text())["layers"]


@pytest.mark.parametrize("layout,engine", [("sglang", "sglang"), ("speculators", "vllm")])
def test_each_layout_reloads_as_trained_by_its_engines_rules(trained, ws, layout, engine):
    from safetensors.torch import load_file

    d = trained / "drafter" / layout
    assert ex.check_export(d, engine, layers(ws)) == []
    names = set(load_file(str(d / ex.WEIGHTS)))
    cfg = json.loads((d / "config.json").read_text())
    expected = set(ex.expected_tensors(ex.layer_config(cfg, engine)))
    if layout == "sglang":       # SGLang shares the target's embedding; speculators' names it layers.0
        assert names == expected - {"embed_tokens.weight"}
    else:
        assert names == {ex.speculators_name(k) for k in expected} and not any(n.startswith("midlayer.") for n in names)
    model = ex.load_drafter(d)
    saved = load_file(str(d / ex.WEIGHTS))
    for k, v in model.trainable_state().items():
        name = k if layout == "sglang" else ex.speculators_name(k)
        assert torch.equal(v, saved[name].to(v.dtype)), k
    other = ex.load_drafter(trained / "drafter" / ("speculators" if layout == "sglang" else "sglang"))
    s = json.loads((trained / "drafter" / layout / ex.INFO).read_text())
    assert s["vocab"]["data_sha256"] and s["aux_layers"]["eagle3"] == layers(ws)["eagle3"]
    ids, aux = torch.arange(100, 140), torch.randn(40, 3, 576)
    assert model.propose(ids, aux, 4) == other.propose(ids, aux, 4)


def test_the_engines_read_the_aux_layer_ids_in_their_own_conventions(trained, ws):
    sg = json.loads((trained / "drafter" / "sglang" / "config.json").read_text())
    sp = json.loads((trained / "drafter" / "speculators" / "config.json").read_text())
    assert sg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]   # SGLang adds 1 itself
    assert sp["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]                  # vLLM: input of layer i
    assert sg["tie_word_embeddings"] is False and sp["transformer_layer_config"]["tie_word_embeddings"] is False
    assert sp["norm_before_residual"] is False


def test_the_speculators_export_names_a_verifier_valid_on_any_machine_and_ships_the_embedding(trained, ws):
    from safetensors import safe_open

    d = trained / "drafter" / "speculators"
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cfg["speculators_version"] == "0.9.0"
    with safe_open(str(d / ex.WEIGHTS), framework="pt") as f:
        embed = f.get_tensor("embed_tokens.weight")
    from drafter_fixtures import shared_target

    assert torch.equal(embed, shared_target().embed_tokens.weight.detach().to(embed.dtype))


def test_the_verifier_is_the_declared_one_else_the_targets_reference():
    assert ex.verifier_reference("org/model", {"kind": "embedded"})["name_or_path"] == "org/model"
    assert ex.verifier_reference(None, {"kind": "embedded", "path": "embedded:x"})["name_or_path"] == ex.EMBEDDED_VERIFIER
    assert ex.verifier_reference(None, {"kind": "hf_dir", "path": "models/qwen3"})["name_or_path"] == "models/qwen3"
    with pytest.raises(ex.ExportError, match="drafter.verifier"):
        ex.verifier_reference(None, {"kind": "hf_dir"})


@pytest.mark.parametrize("change,kinds", [
    (lambda t: t.__setitem__("midlayer.mlp.up_proj.weight", t.pop("layers.0.mlp.up_proj.weight")),
     {"skipped_key", "missing_key"}),
    (lambda t: t.pop("embed_tokens.weight"), {"missing_key"}),
])
def test_check_export_holds_the_speculators_layout_to_speculators_own_names(trained, tmp_path, change, kinds):
    """What speculators' from_pretrained did (interop/check.py): midlayer.* unexpected (the layer
    stays random) and a missing embedding left at zero; vLLM alone would have taken both."""
    from safetensors.torch import load_file

    from draftgate.io import write_safetensors

    d = copy_export(trained, "speculators", tmp_path)
    t = load_file(str(d / ex.WEIGHTS))
    change(t)
    write_safetensors(d / ex.WEIGHTS, t, {"format": "pt"})
    assert {p.kind for p in ex.check_export(d, "vllm")} == kinds


def test_a_verifier_in_this_machines_namespace_fails_check_export(trained, tmp_path):
    d = copy_export(trained, "speculators", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = "embedded:smollm2-135m-instruct"
    (d / "config.json").write_text(json.dumps(cfg))
    assert [p.key for p in ex.check_export(d, "vllm")] == ["speculators_config.verifier.name_or_path"]


def test_sglang_takes_an_optional_model_prefix_and_vllm_does_not():
    assert ex.sglang_param("model.fc.weight") == "model.fc.weight"
    assert ex.sglang_param("fc.weight") == "model.fc.weight"
    assert ex.sglang_param("model.lm_head.weight") is None          # looked up as model.model.lm_head
    assert ex.sglang_param("midlayer.hidden_layernorm.weight") is None
    assert ex.vllm_param("midlayer.self_attn.q_proj.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert ex.vllm_param("layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert ex.speculators_param("midlayer.self_attn.q_proj.weight") is None
    assert ex.speculators_param("layers.0.self_attn.q_proj.weight") == "midlayer.self_attn.q_proj.weight"
    assert ex.vllm_param("d2t") == "draft_id_to_target_id" and ex.vllm_param("t2d") == ""
    assert ex.vllm_param("model.fc.weight") is None


def gate(ws, trained: Path, tmp: Path, sglang: Path | None = None, speculators: Path | None = None) -> tuple[int, set]:
    """The gate as dvc.yaml runs it: its stage, which hands the engine the drafter check."""
    rc, failed, _ = run_drafter_gate(ws, trained, tmp, sglang, speculators)
    return rc, failed


def copy_export(trained: Path, layout: str, tmp: Path) -> Path:
    d = tmp / layout
    shutil.copytree(trained / "drafter" / layout, d)
    return d


def test_the_gate_passes_the_trained_exports(ws, trained, tmp_path):
    assert gate(ws, trained, tmp_path) == (0, set())


def test_a_renamed_key_fails_the_gate(ws, trained, tmp_path):
    from safetensors.torch import load_file, save_file

    d = copy_export(trained, "sglang", tmp_path)
    t = load_file(str(d / ex.WEIGHTS))
    t["midlayer.hidden_layernorm.weight"] = t.pop("midlayer.hidden_norm.weight")
    save_file(t, str(d / ex.WEIGHTS))
    rc, failed = gate(ws, trained, tmp_path, sglang=d)
    assert rc == 1 and {"skipped_keys", "missing_keys"} <= failed


def test_missing_aux_layer_ids_fail_the_gate(ws, trained, tmp_path):
    d = copy_export(trained, "speculators", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["eagle_aux_hidden_state_layer_ids"]
    (d / "config.json").write_text(json.dumps(cfg))
    rc, failed = gate(ws, trained, tmp_path, speculators=d)
    assert rc == 1 and failed == {"aux_layers_match"}


def test_tied_embeddings_fail_the_gate(ws, trained, tmp_path):
    d = copy_export(trained, "sglang", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    rc, failed = gate(ws, trained, tmp_path, sglang=d)
    assert rc == 1 and failed == {"tie_word_embeddings"}


def test_a_nan_weight_and_a_foreign_vocabulary_fail_the_gate(ws, trained, tmp_path):
    from safetensors.torch import load_file, save_file

    d = copy_export(trained, "speculators", tmp_path)
    t = load_file(str(d / ex.WEIGHTS))
    t["norm.weight"][3] = float("nan")
    t["d2t"] = t["d2t"].roll(1)
    save_file(t, str(d / ex.WEIGHTS))
    rc, failed = gate(ws, trained, tmp_path, speculators=d)
    assert rc == 1 and {"nan_tensors", "vocab_map_matches"} <= failed
