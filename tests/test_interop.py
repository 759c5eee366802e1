"""The exports, loaded by speculators' and SpecForge's own code in the side environment (make
interop), agree with draftgate's forward; a renamed key, a dropped tensor, a wrong
norm_before_residual or a missing embedding fails that check.

`make test` builds the side environment (~1.5 GB, once: its stamp) and sets
DRAFTGATE_INTEROP=required, which turns a missing environment into a failure; a bare `pytest`
outside make skips these with the command to run. One reference (interop/reference.py, in this process) and one run
of interop/check.py (the side Python, ~25 s) serve every test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIDE = ROOT / ".venv-interop" / "bin" / "python"
sys.path.insert(0, str(ROOT / "interop"))


def side_python() -> Path:
    if (ROOT / ".venv-interop" / ".installed").is_file() and SIDE.exists():
        return SIDE
    if os.environ.get("DRAFTGATE_INTEROP") == "required":
        pytest.fail("DRAFTGATE_INTEROP=required but .venv-interop is not installed: run `make interop`")
    pytest.skip("the interop side environment is not installed (make interop)")


def corrupt(src: Path, dst: Path, tensors=None, config=None) -> Path:
    from safetensors.torch import load_file

    from draftgate.io import write_safetensors

    shutil.copytree(src, dst)
    if tensors:
        t = load_file(str(dst / "model.safetensors"))
        tensors(t)
        write_safetensors(dst / "model.safetensors", t, {"format": "pt"})
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """The check over the two exports of a drafter at SmolLM2's sizes and four corrupted copies."""
    python = side_python()
    from reference import export_random, main as reference

    root = tmp_path_factory.mktemp("interop")
    exports = export_random(root / "given")
    bad = root / "bad"
    bad.mkdir()
    renamed = corrupt(exports["speculators"], bad / "renamed", tensors=lambda t: t.__setitem__(
        "midlayer.mlp.up_proj.weight", t.pop("layers.0.mlp.up_proj.weight")))
    dropped = corrupt(exports["sglang"], bad / "dropped", tensors=lambda t: t.pop("midlayer.hidden_norm.weight"))
    residual = corrupt(exports["speculators"], bad / "residual",
                       config=lambda c: c.__setitem__("norm_before_residual", True))
    noembed = corrupt(exports["speculators"], bad / "noembed", tensors=lambda t: t.pop("embed_tokens.weight"))
    ref = root / "ref"
    assert reference([str(ref), "--drafter", str(root / "given" / "exports"),
                      "--case", f"renamed=speculators:{renamed}", "--case", f"dropped=sglang:{dropped}",
                      "--case", f"residual=speculators:{residual}", "--case", f"noembed=speculators:{noembed}"]) == 0
    proc = subprocess.run([str(python), str(ROOT / "interop" / "check.py"), str(ref), "--report", str(root / "report.json")],
                          capture_output=True, text=True, timeout=600)
    report = json.loads((root / "report.json").read_text())
    return proc, {c["name"]: c for c in report["cases"]}


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
def test_each_export_loads_weight_for_weight_and_agrees_with_draftgates_forward(checked, layout):
    _, cases = checked
    c = cases[layout]
    assert c["passed"], c
    assert c["keys"] == {"unexpected": [], "missing": [], "differ": []}
    assert c["max_abs_diff"] < 1e-4 and c["argmax_agreement"] == 1.0
    assert c["steps"] == (3 if layout == "speculators" else 1)   # speculators' forward runs its TTT steps


def test_a_key_in_the_wrong_naming_fails_speculators_load(checked):
    c = checked[1]["renamed"]
    assert not c["passed"]
    assert c["keys"]["unexpected"] == ["midlayer.mlp.up_proj.weight"]
    assert c["keys"]["missing"] == ["layers.0.mlp.up_proj.weight"]


def test_a_dropped_tensor_fails_specforges_load(checked):
    c = checked[1]["dropped"]
    assert not c["passed"] and "midlayer.hidden_norm.weight" in c["error"]


def test_a_wrong_norm_before_residual_loads_every_key_and_fails_the_forward(checked):
    c = checked[1]["residual"]
    assert c["keys"] == {"unexpected": [], "missing": [], "differ": []}
    assert not c["passed"] and c["max_abs_diff"] > 1e-2


def test_without_the_shipped_embedding_speculators_loads_zeros_and_fails(checked):
    """Why the speculators layout ships embed_tokens.weight: its fill from the verifier does not
    happen (the NaN marker does not survive from_pretrained)."""
    c = checked[1]["noembed"]
    assert c["keys"]["missing"] == ["embed_tokens.weight"] and not c["passed"] and c["max_abs_diff"] > 0.1


def test_the_check_exits_non_zero_when_any_export_fails(checked):
    proc, _ = checked
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "ok   sglang" in proc.stdout and "FAIL renamed" in proc.stdout
