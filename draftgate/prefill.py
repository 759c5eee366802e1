"""One prefill for two stages ("draftgate.prefill/1"): the repair stage's base pass, kept for hidden.

The repair stage's first pass over prompt + canonical completion is a forward of the target over
the row; with forward hooks it also yields the hidden stage's EAGLE-3 features of that row
(draftgate/target.py `capturing`). Repair writes them here for the rows whose ids its search left
as they were; the hidden stage copies them for every row of the repaired table whose ids equal the
stored ones and runs its own forward on the others (docs/repair.md, "One prefill for two stages").
Both stages reach this module from below, so repair never imports hidden.

The directory: `shard-NNNNN.safetensors`, one per base-pass batch that kept a row (`input_ids`
int64 [T], `row_offsets` int64 [rows + 1], `aux` [T, 3, H] and `final` [T, H] in `hidden.dtype`;
metadata `format` and `prompt_ids`), each written atomically, and `manifest.json` written last:
`format`, `key` (what the features are: weights and config fingerprints, layers, stored and
compute dtypes, and for an engine's its backend, build and tensor-parallel split; the hidden stage
uses them only where its own are equal), `rows`, `tokens`,
`shards` (name, sha256, rows, tokens, bytes), and `skipped` (why no row was kept, or null).
A reader trusts nothing else: no manifest, a shard whose size or sha256 differs, or a count that
disagrees makes the whole prefill unusable (the hidden stage then extracts every row itself).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from draftgate.io import atomic_path, file_sha256, write_json

FORMAT = "draftgate.prefill/1"
MANIFEST = "manifest.json"
KEY_FIELDS = ("weights_fingerprint", "config_sha256", "layers", "dtype", "compute_dtype")
# An engine's prefill (repair/engine.py) adds these; an in-process one has none of them, so the
# in-process hidden stage never takes an engine's features, nor the engine's stage in-process ones.
ENGINE_FIELDS = ("backend", "engine", "tensor_parallel")


def engine_fields(engine: str, tensor_parallel: int) -> dict[str, Any]:
    """ENGINE_FIELDS for features an engine computed: its build (vLLM's distribution and version)
    and tensor-parallel split; the repair stage's prefill and the hidden stage's key both use them."""
    return {"backend": "vllm", "engine": engine, "tensor_parallel": int(tensor_parallel)}


def feature_key(target: Any, layers: Sequence[int], dtype: str) -> dict[str, Any]:
    """What a row's features are a function of, up to float noise (batching, threads, device):
    the hidden stage reuses a prefill only when its own key is equal."""
    return {"weights_fingerprint": target.weights_fingerprint, "config_sha256": target.config_sha256,
            "layers": [int(i) for i in layers], "dtype": dtype, "compute_dtype": target.compute_dtype}


def _clear(directory: Path) -> None:
    """The manifest first: from here until `close`, no reader takes the directory for a finished one."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST).unlink(missing_ok=True)
    for p in sorted(directory.iterdir()):
        if p.is_file():
            p.unlink()


def write_skipped(directory: Path, reason: str) -> dict[str, Any]:
    """An empty prefill that says why (the DVC output exists whatever the backend)."""
    _clear(directory)
    manifest = {"format": FORMAT, "key": None, "rows": 0, "tokens": 0, "shards": [], "skipped": reason}
    write_json(directory / MANIFEST, manifest)
    return manifest


@dataclass
class PrefillWriter:
    """Shards as the base pass goes (one per batch that kept a row), the manifest at `close`."""
    directory: Path
    key: dict[str, Any]
    shards: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    tokens: int = 0
    bytes: int = 0

    def __post_init__(self) -> None:
        _clear(self.directory)

    def add(self, prompt_ids: Sequence[str], ids: Sequence[Sequence[int]], features: Sequence[tuple[Any, Any]]) -> None:
        """Rows of one batch: their ids (prompt + completion) and (aux [T,3,H], final [T,H]) each."""
        import numpy as np
        import torch

        from draftgate.io import safetensors_bytes

        if not prompt_ids:
            return
        lengths = [len(x) for x in ids]
        for pid, n, (aux, final) in zip(prompt_ids, lengths, features):
            if aux.shape[0] != n or final.shape[0] != n:
                raise ValueError(f"prefill row {pid}: {n} ids but features for {aux.shape[0]} positions")
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tensors = {"input_ids": torch.tensor([t for x in ids for t in x], dtype=torch.int64),
                   "row_offsets": torch.from_numpy(offsets),
                   "aux": torch.cat([a for a, _ in features]).contiguous(),
                   "final": torch.cat([f for _, f in features]).contiguous()}
        data = safetensors_bytes(tensors, {"format": FORMAT, "prompt_ids": json.dumps(list(prompt_ids))})
        name = f"shard-{len(self.shards):05d}.safetensors"
        with atomic_path(self.directory / name) as tmp:
            tmp.write_bytes(data)
        self.shards.append({"name": name, "sha256": hashlib.sha256(data).hexdigest(), "rows": len(prompt_ids),
                            "tokens": int(offsets[-1]), "bytes": len(data)})
        self.rows += len(prompt_ids)
        self.tokens += int(offsets[-1])
        self.bytes += len(data)

    def close(self) -> dict[str, Any]:
        manifest = {"format": FORMAT, "key": self.key, "rows": self.rows, "tokens": self.tokens,
                    "shards": self.shards, "skipped": None if self.rows else "no row kept its ids"}
        write_json(self.directory / MANIFEST, manifest)
        return manifest


@dataclass
class Prefill:
    """A verified prefill: each stored row's ids in memory, its features read on demand."""
    directory: Path
    key: dict[str, Any]
    sha256: str                                   # of manifest.json: names every shard's bytes
    where: dict[str, tuple[str, int, int]]        # prompt id -> (shard, first token, end)
    ids: dict[str, Any]                           # prompt id -> numpy int64 [T]

    def features(self, prompt_id: str) -> tuple[Any, Any]:
        from safetensors import safe_open

        name, a, b = self.where[prompt_id]
        with safe_open(str(self.directory / name), framework="pt") as f:
            return f.get_slice("aux")[a:b], f.get_slice("final")[a:b]


def open_prefill(directory: Path) -> tuple[Prefill | None, str]:
    """The prefill, or None and why it cannot be used (the caller extracts those rows itself)."""
    from safetensors import safe_open

    directory = Path(directory)
    try:
        raw = (directory / MANIFEST).read_bytes()
        manifest = json.loads(raw)
    except (OSError, ValueError):
        return None, f"{directory / MANIFEST}: missing or unreadable"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None, f"{directory / MANIFEST}: format {manifest.get('format') if isinstance(manifest, dict) else None!r}, expected {FORMAT!r}"
    if manifest.get("skipped"):
        return None, f"the repair stage kept no features: {manifest['skipped']}"
    where: dict[str, tuple[str, int, int]] = {}
    ids: dict[str, Any] = {}
    for s in manifest.get("shards", []):
        path = directory / s["name"]
        if not path.is_file() or path.stat().st_size != s["bytes"] or file_sha256(path) != s["sha256"]:
            return None, f"{path}: missing, or its size or sha256 is not the manifest's"
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            pids = json.loads(meta.get("prompt_ids", "[]"))
            offsets = f.get_tensor("row_offsets").tolist()
            flat = f.get_tensor("input_ids")
        if meta.get("format") != FORMAT or len(pids) != s["rows"] or len(offsets) != len(pids) + 1:
            return None, f"{path}: its rows are not the manifest's"
        for r, pid in enumerate(pids):
            where[pid] = (s["name"], offsets[r], offsets[r + 1])
            ids[pid] = flat[offsets[r]:offsets[r + 1]]
    if len(where) != manifest.get("rows"):
        return None, f"{directory / MANIFEST}: {manifest.get('rows')} rows listed, {len(where)} distinct stored"
    return Prefill(directory, manifest.get("key") or {}, hashlib.sha256(raw).hexdigest(), where, ids), ""
