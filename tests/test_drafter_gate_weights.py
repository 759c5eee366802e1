"""The drafter gate looks at the weights' values, not only their names and shapes.

On the shared tiny training run (tests/drafter_fixtures.py: real SmolLM2 features of 8 rows), the
gate runs the exported drafter at TTT step 0 on stored training rows and holds its loss against
the loss curve's end, and holds the two layouts' weights equal. Each corruption rewrites the
exported files themselves: fc rows permuted, every weight re-initialised, one layout's tensor
changed, and the speculators config given a top-level tie_word_embeddings (which vLLM ignores and a
PretrainedConfig reader obeys).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from drafter_fixtures import run_drafter_gate, trained, ws  # noqa: F401 (the module's fixtures)
from draftgate.drafter import export as ex


def gate(ws, trained: Path, tmp: Path, sglang: Path | None = None, speculators: Path | None = None) -> tuple[int, set, dict]:
    rc, failed, result = run_drafter_gate(ws, trained, tmp, sglang, speculators)
    return rc, failed, result["computed"]["report"]


def rewrite_both(trained: Path, tmp: Path, change) -> tuple[Path, Path]:
    """Both layouts copied and their weights rewritten by `change(tensors)` (a buggy trainer
    exports the same wrong weights twice), with the project's safetensors writer."""
    from safetensors.torch import load_file

    from draftgate.io import write_safetensors

    out = []
    for layout in ("sglang", "speculators"):
        d = tmp / layout
        shutil.copytree(trained / "drafter" / layout, d)
        t = load_file(str(d / ex.WEIGHTS))
        change(t)
        write_safetensors(d / ex.WEIGHTS, t, {"format": "pt"})
        out.append(d)
    return out[0], out[1]


def test_the_trained_exports_reach_the_step0_loss_the_curve_ends_at(ws, trained, tmp_path):
    rc, failed, report = gate(ws, trained, tmp_path)
    assert (rc, failed) == (0, set())
    step0 = report["step0"]
    assert step0["positions"] > 50 and step0["ratio"] <= 1.25
    assert 0 < step0["accuracy"] <= 1


def test_permuted_fc_rows_fail_the_step0_loss(ws, trained, tmp_path):
    import torch

    def permute(t):
        t["fc.weight"] = t["fc.weight"][torch.randperm(t["fc.weight"].shape[0], generator=torch.Generator().manual_seed(0))]

    sg, sp = rewrite_both(trained, tmp_path, permute)
    rc, failed, report = gate(ws, trained, tmp_path, sglang=sg, speculators=sp)
    assert rc == 1 and failed == {"step0_loss_ratio"}, report


def test_re_initialised_weights_fail_the_step0_loss(ws, trained, tmp_path):
    import torch

    from draftgate.drafter.model import DrafterConfig, Eagle3Drafter

    info = ex.read_info(trained / "drafter" / "sglang")
    torch.manual_seed(0)
    fresh = Eagle3Drafter(DrafterConfig.from_dict(info["drafter_config"])).trainable_state()
    fresh.update({ex.speculators_name(k): v for k, v in fresh.items()})   # the speculators layout's names

    def reinit(t):
        for k in t:
            if k not in ("d2t", "t2d", "embed_tokens.weight"):   # the target's embedding stays
                t[k] = fresh[k].to(t[k].dtype).contiguous()

    sg, sp = rewrite_both(trained, tmp_path, reinit)
    rc, failed, report = gate(ws, trained, tmp_path, sglang=sg, speculators=sp)
    assert rc == 1 and failed == {"step0_loss_ratio"}, report
    assert report["step0"]["ratio"] > 1.25


def test_layouts_with_different_weights_fail_weights_match(ws, trained, tmp_path):
    from safetensors.torch import load_file

    from draftgate.io import write_safetensors

    d = tmp_path / "speculators"
    shutil.copytree(trained / "drafter" / "speculators", d)
    t = load_file(str(d / ex.WEIGHTS))
    t["layers.0.mlp.down_proj.weight"] = t["layers.0.mlp.down_proj.weight"] * 1.01   # speculators' names
    write_safetensors(d / ex.WEIGHTS, t, {"format": "pt"})
    rc, failed, _ = gate(ws, trained, tmp_path, speculators=d)
    assert rc == 1 and failed == {"weights_match"}


def test_a_top_level_tie_flag_in_the_speculators_config_fails_as_a_vllm_misread(ws, trained, tmp_path):
    d = tmp_path / "speculators"
    shutil.copytree(trained / "drafter" / "speculators", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = True          # transformer_layer_config still says false
    (d / "config.json").write_text(json.dumps(cfg))
    rc, failed, report = gate(ws, trained, tmp_path, speculators=d)
    assert rc == 1 and failed == {"vllm_misreads"}
    assert "top-level tie_word_embeddings True" in report["problems"]["speculators"]


def test_a_transposed_fc_weight_in_the_sglang_export_is_a_failed_check_naming_the_tensor(ws, trained, tmp_path):
    # torch's size mismatch used to escape the step-0 check: the gate exited 2, "internal error".
    from safetensors.torch import load_file

    from draftgate.io import write_safetensors

    d = tmp_path / "sglang"
    shutil.copytree(trained / "drafter" / "sglang", d)
    t = load_file(str(d / ex.WEIGHTS))
    t["fc.weight"] = t["fc.weight"].T.contiguous()
    write_safetensors(d / ex.WEIGHTS, t, {"format": "pt"})
    rc, failed, report = gate(ws, trained, tmp_path, sglang=d)
    assert rc == 1 and {"shape_errors", "step0_loss_ratio"} <= failed, report
    assert report["step0"]["ratio"] is None
    assert "fc.weight" in report["problems"]["sglang"] and "(transposed)" in report["problems"]["sglang"]
