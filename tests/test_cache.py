"""draftgate.cache: one policy for converted tokenizers and models (content-hash keys, atomic
publish, manifest checked on every load, umask-honouring modes)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from draftgate import cache


def builder(calls: list, text: str = "v1"):
    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "tokenizer.json").write_text(text)
        (folder / "sub").mkdir()
        (folder / "sub" / "weights.bin").write_bytes(b"\0" * 10)
    return build


def test_an_entry_is_built_once_then_reused_and_lives_under_draftgate_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTGATE_CACHE", str(tmp_path))
    calls: list = []
    first = cache.entry("thing", "ab" * 32, builder(calls), inputs={"source_sha256": "x"})
    again = cache.entry("thing", "ab" * 32, builder(calls))
    assert len(calls) == 1 and (first.built, again.built) == (True, False)
    assert first.path == tmp_path / f"thing-{'ab' * 8}" == again.path
    assert first.fingerprint == again.fingerprint and again.inputs == {"source_sha256": "x"}
    manifest = json.loads((first.path / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["sub/weights.bin", "tokenizer.json"]
    assert not list(tmp_path.glob(".*"))                      # no temp folder left behind


@pytest.mark.parametrize("damage", ["edit", "extra_file", "missing_file", "no_manifest", "other_key"])
def test_an_incomplete_or_altered_entry_is_rebuilt_never_trusted(tmp_path, capsys, damage):
    calls: list = []
    entry = cache.entry("thing", "cd" * 32, builder(calls), cache_root=tmp_path)
    if damage == "edit":
        (entry.path / "tokenizer.json").write_text("edited")
    elif damage == "extra_file":
        (entry.path / "stray.txt").write_text("?")
    elif damage == "missing_file":
        (entry.path / "sub" / "weights.bin").unlink()
    elif damage == "no_manifest":
        (entry.path / "manifest.json").unlink()
    else:
        manifest = json.loads((entry.path / "manifest.json").read_text())
        (entry.path / "manifest.json").write_text(json.dumps({**manifest, "key": "ef" * 32}))
    rebuilt = cache.entry("thing", "cd" * 32, builder(calls, "v1"), cache_root=tmp_path)
    assert len(calls) == 2 and rebuilt.built and rebuilt.fingerprint == entry.fingerprint
    assert (rebuilt.path / "tokenizer.json").read_text() == "v1"
    assert f"cache entry {entry.path} is incomplete or altered; rebuilding" in capsys.readouterr().err


def test_a_file_whose_stat_is_the_one_stamped_at_its_last_check_is_not_hashed_again(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "RACY_S", 0.0)        # the files were just written: stamp them all the same
    calls: list = []
    entry = cache.entry("thing", "cd" * 32, builder(calls), cache_root=tmp_path)
    stamp = json.loads((entry.path / ".verified.json").read_text())
    assert sorted(stamp) == ["sub/weights.bin", "tokenizer.json"]
    real = cache._read_sha256
    read: list = []
    monkeypatch.setattr(cache, "_read_sha256", lambda p: read.append(Path(p).name) or real(p))
    assert cache.entry("thing", "cd" * 32, builder(calls), cache_root=tmp_path).built is False
    assert read == [] and len(calls) == 1
    # Same size, and the mtime put back: the write still moved the ctime, so the file is read again.
    path = entry.path / "tokenizer.json"
    st = path.stat()
    path.write_text("v2")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    rebuilt = cache.entry("thing", "cd" * 32, builder(calls), cache_root=tmp_path)
    assert read[0] == "tokenizer.json" and rebuilt.built and len(calls) == 2   # (then the rebuild's own)


def test_a_damaged_stamp_only_means_every_file_is_hashed_again(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "RACY_S", 0.0)
    entry = cache.entry("thing", "cd" * 32, builder([]), cache_root=tmp_path)
    for damage in ("[1, 2]", "{not json"):
        (entry.path / ".verified.json").write_text(damage)
        again = cache.entry("thing", "cd" * 32, builder([]), cache_root=tmp_path)
        assert again.built is False and again.fingerprint == entry.fingerprint
        assert sorted(json.loads((entry.path / ".verified.json").read_text())) == ["sub/weights.bin", "tokenizer.json"]


def test_a_file_written_in_the_last_seconds_is_hashed_on_every_load_and_not_stamped(tmp_path):
    entry = cache.entry("thing", "cd" * 32, builder([]), cache_root=tmp_path)
    assert cache.entry("thing", "cd" * 32, builder([]), cache_root=tmp_path).built is False
    stamp = entry.path / ".verified.json"
    assert not stamp.exists() or json.loads(stamp.read_text()) == {}


def test_two_verified_entries_assemble_into_one_folder_without_their_stamps_or_manifests(tmp_path, monkeypatch):
    # engine/model.py puts the weights and tokenizer entries side by side for vLLM. Each entry has
    # its own manifest and stat stamp; on a fresh cache both stamps were taken for model files.
    from draftgate.engine.model import assemble

    monkeypatch.setattr(cache, "RACY_S", 0.0)
    weights = cache.entry("w", "01" * 32, lambda f: (f / "model.safetensors").write_bytes(b"w"), cache_root=tmp_path)
    tok = cache.entry("t", "02" * 32, lambda f: (f / "tokenizer.json").write_text("{}"), cache_root=tmp_path)
    assert (weights.path / ".verified.json").exists() and (tok.path / ".verified.json").exists()
    folder = tmp_path / "served"
    folder.mkdir()
    assemble(weights.path, tok.path, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors", "tokenizer.json"]
    # A real clash between the two entries' content still stops it, naming the file.
    (tok.path / "model.safetensors").write_bytes(b"t")
    (tmp_path / "again").mkdir()
    with pytest.raises(RuntimeError, match="would overwrite model.safetensors"):
        assemble(weights.path, tok.path, tmp_path / "again")


def test_the_fingerprint_names_the_content(tmp_path):
    a = cache.entry("a", "01" * 32, builder([], "one"), cache_root=tmp_path)
    b = cache.entry("b", "02" * 32, builder([], "one"), cache_root=tmp_path)
    c = cache.entry("c", "03" * 32, builder([], "two"), cache_root=tmp_path)
    assert a.fingerprint == b.fingerprint != c.fingerprint


def test_a_twin_that_published_first_is_kept(tmp_path):
    calls: list = []

    def racing(folder: Path) -> None:
        builder(calls)(folder)
        if len(calls) == 1:   # another process publishes the same entry while this one builds
            cache.entry("thing", "aa" * 32, racing, cache_root=tmp_path)

    entry = cache.entry("thing", "aa" * 32, racing, cache_root=tmp_path)
    assert len(calls) == 2 and (entry.path / "tokenizer.json").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [entry.path.name]


def test_a_failed_build_leaves_nothing(tmp_path):
    def broken(folder: Path) -> None:
        (folder / "half.json").write_text("{")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        cache.entry("thing", "bb" * 32, broken, cache_root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_entries_follow_the_umask_so_a_shared_cache_is_readable(tmp_path):
    old = os.umask(0o022)
    try:
        entry = cache.entry("thing", "dd" * 32, builder([]), cache_root=tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(entry.path.stat().st_mode) == 0o755
    assert stat.S_IMODE((entry.path / "manifest.json").stat().st_mode) == 0o644


def test_the_recipe_is_the_build_codes_own_text_so_a_fix_changes_the_key(tmp_path, monkeypatch):
    module = tmp_path / "recipe_probe.py"
    module.write_text("def convert(x):\n    return x + 1\n\ndef other():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = cache.recipe("recipe_probe", "convert")
    assert before == "def convert(x):\n    return x + 1"
    module.write_text("def convert(x):\n    return x + 2  # the fix\n\ndef other():\n    pass\n")
    os.utime(module, ns=(1, 1))
    assert cache.recipe("recipe_probe", "convert") != before
    with pytest.raises(ValueError, match="no top-level function nope"):
        cache.recipe("recipe_probe", "nope")
    sys.modules.pop("recipe_probe", None)


def test_the_tokenizer_and_model_recipes_are_in_their_cache_keys():
    from draftgate.tokenizers import smollm2

    assert "_convert_smollm2" in cache.recipe(smollm2.__name__, "load_smollm2", "_convert_smollm2", "_gguf_pre")
    assert "save_pretrained" in cache.recipe("draftgate.serve.model", "convert")
