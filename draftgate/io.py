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


# safetensors (its README, "Format"): an 8-byte little-endian header length N, N bytes of JSON
# (`__metadata__`: str -> str, then name -> dtype, shape, data_offsets into the buffer), the buffer.
# Its own writers serialise `__metadata__` from a Rust HashMap, in a per-process random order, and
# `save_file` creates files 0600 whatever the umask: DVC then sees changed bytes on every rerun with
# equal tensors. So we write the header ourselves, laid out as safetensors lays it out (tensors by
# dtype, widest first, then by name; the header padded with spaces to 8 bytes; compact JSON), with
# the metadata keys sorted: where safetensors' order happens to be fixed (one key) the bytes are
# its own, and its `safe_open`/`load_file` read every file (tests/test_safetensors_bytes.py).
# Widest first keeps every tensor aligned to its itemsize for zero-copy readers.
_ST_DTYPES = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
              "I32", "U32", "F32", "F64", "I64", "U64")     # safetensors' Dtype order, narrow to wide
_NUMPY_ST = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "float16": "F16",
             "int32": "I32", "uint32": "U32", "float32": "F32", "float64": "F64", "int64": "I64",
             "uint64": "U64"}
_TORCH_ST = {**_NUMPY_ST, "bfloat16": "BF16", "float8_e5m2": "F8_E5M2", "float8_e4m3fn": "F8_E4M3"}


def _tensor_view(name: str, value: Any) -> tuple[str, list[int], memoryview]:
    """(safetensors dtype, shape, little-endian bytes) of a numpy array or torch tensor, no copy
    for a contiguous CPU tensor."""
    import numpy as np

    if type(value).__module__.startswith("torch"):
        import torch

        t = value.detach().cpu().contiguous()
        dtype = _TORCH_ST.get(str(t.dtype).removeprefix("torch."))
        if dtype is None:
            raise TypeError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name; cast it to one of "
                            f"{sorted(_TORCH_ST)}")
        shape = list(t.shape)
        # A byte view keeps bf16/fp8 (which numpy lacks) and bool as they are in memory.
        arr = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
    else:
        arr = np.asarray(value)
        dtype = _NUMPY_ST.get(arr.dtype.name)
        if dtype is None:
            raise TypeError(f"tensor {name!r}: dtype {arr.dtype} has no safetensors name; cast it to one of "
                            f"{sorted(_NUMPY_ST)}")
        shape = list(arr.shape)
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).reshape(-1)
    return dtype, shape, memoryview(arr).cast("B")


def _safetensors_parts(tensors: dict[str, Any], metadata: dict[str, str] | None) -> list[Any]:
    """The header bytes, then each tensor's bytes in file order."""
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"safetensors metadata {k!r}: keys and values must be str (json.dumps the value)")
    if "__metadata__" in tensors:
        raise ValueError("a tensor cannot be named '__metadata__' (safetensors keeps that key for metadata)")
    views = {name: _tensor_view(name, v) for name, v in tensors.items()}
    order = sorted(views, key=lambda n: (-_ST_DTYPES.index(views[n][0]), n))
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))} if metadata else {}
    offset = 0
    for name in order:
        dtype, shape, data = views[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little") + text] + [views[n][2] for n in order]


def safetensors_bytes(tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file's bytes: the same tensors and metadata give the same bytes in any process."""
    return b"".join(_safetensors_parts(tensors, metadata))


def write_safetensors(target: str | Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> None:
    """`safetensors_bytes` written atomically with the umask's mode, tensor by tensor (no joined copy)."""
    parts = _safetensors_parts(tensors, metadata)
    with atomic_path(target) as tmp, open(tmp, "wb") as f:
        for part in parts:
            f.write(part)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
