"""Atomic writes: all or nothing, and modes that follow the umask like any other program's files."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pyarrow as pa
import pytest

from draftgate import io
from draftgate.client.journal import Journal

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def umask():
    old = os.umask(0o022)
    def set_(mask: int) -> None:
        os.umask(mask)
    yield set_
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def write_everything(d: Path) -> list[Path]:
    io.write_text(d / "a.txt", "x")
    io.write_json(d / "b.json", {"a": 1})
    io.write_jsonl(d / "c.jsonl", [{"a": 1}])
    io.write_parquet(d / "d.parquet", pa.table({"a": [1]}))

    async def journal() -> None:
        async with Journal(d / "journal.jsonl") as j:
            await j.append({"prompt_id": "p", "status": "ok"})
    asyncio.run(journal())
    return [d / n for n in ("a.txt", "b.json", "c.jsonl", "d.parquet", "journal.jsonl")]


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                       (0o002, 0o664, 0o775)])
def test_artifacts_and_temp_dirs_get_the_mode_the_umask_allows(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    for path in write_everything(tmp_path):
        assert mode(path) == file_mode, path
    assert mode(io.new_temp_dir(tmp_path, "cache-entry")) == dir_mode
    assert not list(tmp_path.glob(".*.tmp")) or all(p.is_dir() for p in tmp_path.glob(".*.tmp"))


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    io.write_text(tmp_path / "a.txt", "old")
    with pytest.raises(RuntimeError):
        with io.atomic_path(tmp_path / "a.txt") as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert (tmp_path / "a.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_stage_run_under_umask_022_leaves_every_output_readable_by_others(tmp_path, umask):
    from stages.prompts import main

    umask(0o022)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    (tmp_path / "params.yaml").write_text("prompts:\n  heldout_fraction: 0.1\n")
    assert main(["--params", str(tmp_path / "params.yaml"), "--raw", str(tmp_path / "raw"),
                 "--out", str(tmp_path / "out"), "--metrics", str(tmp_path / "metrics" / "prompts.json")]) == 0
    written = [*(tmp_path / "out").iterdir(), tmp_path / "metrics" / "prompts.json"]
    assert len(written) == 3 and all(mode(p) == 0o644 for p in written), {p.name: oct(mode(p)) for p in written}
