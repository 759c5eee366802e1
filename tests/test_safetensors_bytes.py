"""Every safetensors file draftgate writes (draftgate/io.py's writer) has the same bytes in any
process, the umask's mode, and loads with safetensors' own readers.

safetensors' own writers order `__metadata__` per process and create files 0600, so before this
writer data/drafter/vocab.safetensors changed bytes on every train run with equal tensors.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from draftgate import io

ROOT = Path(__file__).resolve().parents[1]


def write_all(out: Path) -> None:
    """One of each artifact kind: a file with eight metadata keys and every dtype we store, the
    vocabulary map, a hidden shard with its sidecar, both exports of a tiny drafter."""
    from draftgate.drafter import export as ex
    from draftgate.drafter import vocab as vc
    from draftgate.drafter.model import DrafterConfig
    from draftgate.hidden import shards

    out.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    io.write_safetensors(out / "mixed.safetensors",
                         {"bf16": torch.randn(4, 3, generator=g).bfloat16(), "ids": torch.arange(5),
                          "mask": torch.tensor([True, False, True]), "f32": np.linspace(0, 1, 7, dtype=np.float32)},
                         {f"key{k}": str(k) for k in "hgfedcba"})
    counts = np.bincount([3, 3, 5, 7, 7, 7, 11], minlength=32)
    vc.save(vc.build_vocab_map(counts, 6, "ab" * 32, "kept rows, split in ['train']"), out / "vocab.safetensors")
    rows = shards.TokenRows(["p1", "p2"], [np.arange(4, dtype=np.int64), np.arange(3, dtype=np.int64)],
                            [np.array([0, 1, 1, 1], np.uint8), np.array([0, 0, 1], np.uint8)], "cd" * 32)
    plan = shards.ShardPlan(shards.shard_name(0), [0, 1], [[0, 1]])
    features = {i: (torch.randn(n, 3, 8, generator=g).bfloat16(), torch.randn(n, 8, generator=g).bfloat16())
                for i, n in enumerate(rows.lengths)}
    shards.write_shard(out, plan, shards.shard_bytes(rows, plan, features), {"tokens_sha256": rows.sha256})
    c = DrafterConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=4, rms_norm_eps=1e-6, vocab_size=32, draft_vocab_size=6, target_hidden_size=8,
                      max_position_embeddings=64, hidden_act="silu",
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, aux_layers=(0, 1, 2),
                      target_num_layers=4)
    vmap = vc.load(out / "vocab.safetensors")
    for layout in ("sglang", "speculators"):
        ex.export(TinyDrafter(c, vmap, g), out / layout, layout, info={"vocab": vmap.describe()},
                  verifier=ex.verifier_reference(None, {"kind": "embedded"}))


class TinyDrafter:
    """What export() reads of an Eagle3Drafter (config, trainable_state), every tensor the engines
    load at the shapes they build: the real class would import transformers, ~4 s of the test."""

    def __init__(self, c, vmap, g):
        from draftgate.drafter.export import expected_tensors

        self.config = c
        self.state = {name: torch.randn(*shape, generator=g) for name, (shape, kind) in
                      expected_tensors(c.to_dict()).items() if kind == "float" and name != "embed_tokens.weight"}
        self.state.update(d2t=torch.from_numpy(vmap.d2t), t2d=torch.from_numpy(vmap.t2d))
        # the target's embedding, which the speculators layout ships
        self.embed_tokens = torch.nn.Embedding.from_pretrained(torch.randn(c.vocab_size, c.hidden_size, generator=g))

    def trainable_state(self):
        return self.state


def files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The same artifacts written here and by a second process with another hash seed (each process
    also draws its own Rust HashMap keys, the order safetensors' writer used)."""
    base = tmp_path_factory.mktemp("st_bytes")
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = {**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    other = subprocess.Popen([sys.executable, "-c", "import sys; from test_safetensors_bytes import write_all; "
                              "from pathlib import Path; write_all(Path(sys.argv[1]))", str(base / "b")],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    write_all(base / "a")
    out, _ = other.communicate(timeout=300)
    assert other.returncode == 0, out.decode()[-3000:]
    return base / "a", base / "b"


def test_two_processes_write_the_same_bytes_for_every_artifact_kind(written):
    a, b = (files(d) for d in written)
    assert sorted(a) == ["mixed.safetensors", "sglang/config.json", "sglang/draftgate.json",
                         "sglang/model.safetensors", "shard-00000.json", "shard-00000.safetensors",
                         "speculators/config.json", "speculators/draftgate.json",
                         "speculators/model.safetensors", "vocab.safetensors"]
    assert [name for name in a if a[name] != b[name]] == []
    umask = os.umask(0)
    os.umask(umask)
    # The exports' weights included: safetensors' save_file made them 0600 whatever the umask.
    modes = {name: stat.S_IMODE((written[0] / name).stat().st_mode) for name in a}
    assert modes == {name: 0o666 & ~umask for name in a}


def test_safetensors_own_readers_load_what_we_write(written):
    from safetensors import safe_open
    from safetensors.torch import load_file

    d = written[0]
    with safe_open(str(d / "mixed.safetensors"), framework="pt") as f:
        assert f.metadata() == {f"key{k}": str(k) for k in "abcdefgh"}
        assert f.get_tensor("bf16").dtype == torch.bfloat16 and f.get_tensor("bf16").shape == (4, 3)
        assert torch.equal(f.get_tensor("ids"), torch.arange(5))
        assert f.get_tensor("mask").tolist() == [True, False, True]
    with safe_open(str(d / "mixed.safetensors"), framework="numpy") as f:
        assert np.array_equal(f.get_tensor("f32"), np.linspace(0, 1, 7, dtype=np.float32))
    shard = load_file(str(d / "shard-00000.safetensors"))
    assert shard["input_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2] and shard["row_offsets"].tolist() == [0, 4, 7]
    assert shard["aux"].shape == (7, 3, 8) and shard["final"].dtype == torch.bfloat16
    from draftgate.drafter import vocab as vc

    # The 4 seen ids, padded with the smallest unseen ones, ascending.
    assert vc.load(d / "vocab.safetensors").draft_ids.tolist() == [0, 1, 3, 5, 7, 11]
    from draftgate.drafter.export import check_export

    assert check_export(d / "sglang", "sglang") == [] and check_export(d / "speculators", "vllm") == []


def test_with_one_metadata_key_the_bytes_are_safetensors_own():
    """The layout is safetensors' (dtype widest first, then name; header padded to 8 bytes): where
    its metadata order cannot vary, as in the exports' {"format": "pt"}, our bytes are its bytes."""
    from safetensors.torch import save

    g = torch.Generator().manual_seed(1)
    tensors = {"w": torch.randn(3, 5, generator=g).bfloat16(), "d2t": torch.arange(4), "t2d": torch.rand(6) > 0.5,
               "a": torch.randn(2, generator=g), "empty": torch.zeros(0, 3), "h": torch.randn(2, generator=g).half()}
    assert io.safetensors_bytes(tensors, {"format": "pt"}) == save(tensors, metadata={"format": "pt"})


@pytest.mark.parametrize("mask, want", [(0o002, 0o664), (0o022, 0o644)])
def test_files_get_the_mode_the_umask_allows(tmp_path, mask, want):
    from draftgate.drafter import vocab as vc

    old = os.umask(mask)
    try:
        io.write_safetensors(tmp_path / "x.safetensors", {"a": np.zeros(2, np.float32)})
        vc.save(vc.build_vocab_map(np.arange(8), 4, "0" * 64), tmp_path / "vocab.safetensors")
    finally:
        os.umask(old)
    for name in ("x.safetensors", "vocab.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == want, name
    assert not list(tmp_path.glob(".*.tmp"))


def test_metadata_values_must_be_strings_and_the_error_names_the_key(tmp_path):
    with pytest.raises(TypeError, match="'rows'.*json.dumps"):
        io.write_safetensors(tmp_path / "x.safetensors", {"a": np.zeros(1)}, {"rows": 3})
    with pytest.raises(TypeError, match="'c'.*complex64"):
        io.safetensors_bytes({"c": np.zeros(1, np.complex64)})
    assert not list(tmp_path.iterdir())
