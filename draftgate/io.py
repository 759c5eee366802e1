"""Atomic outputs: write to a temp name beside the target, fsync, rename.

A crash leaves either the old file or nothing, never a partial file that looks complete.

Modes follow the umask, as `open()` would: files 0666 & ~umask, directories 0777 & ~umask
(0644 / 0755 under the usual 022). `tempfile.mkstemp`/`mkdtemp` would make every artifact 0600 /
0700 whatever the umask, and a teammate or a shared DVC cache could not read it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any, Iterator


CHUNK = 1 << 20   # 1 MiB reads: hashing a 93 MB GGUF or a 1 GB shard holds one chunk in memory


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def text_sha256(text: str) -> str:
    """Hex sha256 of a string's UTF-8 bytes (template texts, canonical JSON)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def new_temp_file(directory: Path, name: str) -> Path:
    """An empty file `.<name>.<random>.tmp` in `directory`, created exclusively, mode per umask."""
    for _ in range(64):
        path = directory / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{directory}: no free temp name for {name}; clear stale .{name}.*.tmp files")


def new_temp_dir(directory: Path, name: str) -> Path:
    """An empty directory `.<name>.<random>.tmp` in `directory`, mode per umask (mkdtemp: 0700)."""
    directory.mkdir(parents=True, exist_ok=True)
    for _ in range(64):
        path = directory / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            os.mkdir(path, 0o777)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{directory}: no free temp name for {name}; clear stale .{name}.*.tmp folders")


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temp path in the target's directory; rename it over the target on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = new_temp_file(target.parent, target.name)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, target)
        _fsync_dir(target.parent)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text(target: str | Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(target: str | Path, obj: Any) -> None:
    write_text(target, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_jsonl(target: str | Path, rows: Any) -> None:
    with atomic_path(target) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")


def write_parquet(target: str | Path, table: Any) -> None:
    """Write a pyarrow Table atomically (zstd; row groups sized for DuckDB scans)."""
    import pyarrow.parquet as pq

    with atomic_path(target) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
