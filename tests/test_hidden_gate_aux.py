"""The hidden gate checks EVERY row's aux features, not only the re-extracted sample.

The corruptions change the data itself: a clean directory's shard is read, two rows' aux tensors
(or one slot of them) are swapped over the positions both rows have, and the shard is rewritten
with the project's safetensors writer (draftgate/io.py) and its new sha256 put in the manifest, as
a producer with a row mix-up would write it. The re-extraction samples one row that the swap
leaves alone, so only the whole-table checks can see it (docs/hidden-gate.md, "Every row's aux
features").
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from test_hidden_gate_files import greedy_world, run_hidden_gate


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = greedy_world(tmp_path_factory.mktemp("hidden_gate_aux"))
    # Resample one row only, and one the swaps below leave alone (the shard with the third row).
    from draftgate.checks.hidden import choose_resample

    seed = next(s for s in range(100) if {k[0] for k in choose_resample(w["clean"], 1, s)} == {"shard-00001.safetensors"})
    params = yaml.safe_load(w["params"].read_text())
    params["gates"]["hidden"] = {"resample_rows": 1, "resample_seed": seed}
    w["params"].write_text(yaml.safe_dump(params))
    return w


def failed(result) -> set[str]:
    return {e["kwargs"].get("column", e["type"]) for e in result["expectations"] if not e["success"]}


def column(result, name):
    return next(e for e in result["expectations"] if e["kwargs"].get("column") == name)


def swap_aux(world, name: str, slots: slice = slice(None)):
    """A copy of the clean directory whose first shard holds rows 0 and 1 with their aux `slots`
    swapped over the positions both rows have; the shard rewritten, its hash in the manifest."""
    from safetensors.torch import load_file

    from draftgate.io import file_sha256, write_safetensors

    out = world["root"] / name
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(world["clean"], out)
    shard = out / "shard-00000.safetensors"
    from safetensors import safe_open

    with safe_open(str(shard), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(shard))
    (a0, a1), (b0, b1) = tensors["row_offsets"].tolist()[:2], tensors["row_offsets"].tolist()[1:3]
    n = min(a1 - a0, b1 - b0)
    aux = tensors["aux"]
    first = aux[a0:a0 + n, slots].clone()
    aux[a0:a0 + n, slots] = aux[b0:b0 + n, slots]
    aux[b0:b0 + n, slots] = first
    write_safetensors(shard, tensors, meta)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0]["sha256"] = file_sha256(shard)
    manifest["shards"][0]["bytes"] = shard.stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


def test_clean_features_pass_every_row_aux_check_and_report_the_figures(world):
    result = run_hidden_gate(world["clean"], world["tokens"], world["params"])
    assert failed(result) == set(), json.dumps(result["expectations"], indent=1)[:2000]
    chain = result["computed"]["report"]["aux_chain"]
    assert chain["low_error"]["max"] < 4e-3        # bfloat16 rounding of the stored slot
    assert chain["top_error"]["max"] < 1.2e-2      # the same, carried through SmolLM2's last 3 layers
    assert chain["seconds"] >= 0


def test_two_rows_with_swapped_aux_tensors_fail_every_row_check_naming_both(world):
    result = run_hidden_gate(swap_aux(world, "swap_all"), world["tokens"], world["params"])
    assert failed(result) == {"aux_not_this_row"}     # the sampled row is intact: the resample passes
    rows = column(result, "aux_not_this_row")["unexpected_sample"]
    assert sorted(r.split(":")[0] for r in rows) == ["p0", "p1"]


def test_a_swap_of_only_the_highest_slot_fails_the_chain_to_the_final_state(world):
    result = run_hidden_gate(swap_aux(world, "swap_top", slice(2, 3)), world["tokens"], world["params"])
    assert failed(result) == {"aux_not_this_row"}
    assert all("highest slot" in r for r in column(result, "aux_not_this_row")["unexpected_sample"])


def test_a_swap_of_only_the_middle_slot_fails_its_margin_to_the_lowest(world):
    result = run_hidden_gate(swap_aux(world, "swap_mid", slice(1, 2)), world["tokens"], world["params"])
    assert failed(result) == {"row_mid_margin"}


def test_the_middle_margin_holds_for_a_row_that_repeats_itself_and_drops_for_another_rows_slot():
    # A row that repeats with a period dividing half its length is its own text half a row away:
    # the one-shift baseline read such a (true) row sampled by vLLM as 0.069, under the 0.1 floor.
    import torch

    from draftgate.checks.hidden import mid_margin

    g = torch.Generator().manual_seed(0)
    period = torch.randn(8, 64, generator=g)
    low = period.repeat(8, 1)                                       # 64 positions, period 8
    mid = low + 0.8 * torch.randn(low.shape, generator=g)           # the residual keeps each token's direction
    other = torch.randn(8, 64, generator=g).repeat(8, 1) + 0.8 * torch.randn(low.shape, generator=g)
    assert mid_margin(low, mid) > 0.3
    assert abs(mid_margin(low, other)) < 0.05
