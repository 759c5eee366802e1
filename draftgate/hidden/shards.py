"""The hidden-state artifact ("draftgate.hidden/1"): plan, write, resume, merge.

docs/hidden-states.md describes the format. In short: `shard-NNNNN.safetensors` files of bounded
size (ids, loss mask, row offsets, aux [T,3,H], final [T,H]), `index.parquet` (one line per kept
tokens row, in table order) and `manifest.json`, written last.

The plan is a pure function of the kept rows and the params: rows sorted by length (longest first)
are cut into shards by bytes, and each shard into forward batches by padded tokens. So a rerun, a
resumed run, a torchrun with any number of ranks and the online reader all group the same rows
the same way, and produce the same bytes (docs/hidden-states.md, "Determinism").

Resume trusts a shard only when a record of it exists (the manifest of a finished run, or the
sidecar `shard-NNNNN.json` written atomically right after the shard itself) and the record's key
(tokens hash, weights, layers, dtypes, plan params) equals this run's, the file's sha256 equals the
record's, and its stored prompt ids are the plan's. Every other file is removed and recomputed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from draftgate.io import atomic_path, file_sha256, write_json

FORMAT = "draftgate.hidden/1"
MANIFEST = "manifest.json"
INDEX = "index.parquet"
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
MB = 1_000_000
_HEADER_BYTES = 2048            # safetensors JSON header: tensor entries and the format string


class ShardError(ValueError):
    """An artifact that does not hold what its manifest says."""


@dataclass(frozen=True)
class TokenRows:
    """Kept rows of tokens.parquet (quarantine_reason IS NULL), in table order."""
    prompt_ids: list[str]
    input_ids: list[Any]          # numpy int64 arrays
    loss_mask: list[Any]          # numpy uint8 arrays
    sha256: str                   # of the tokens.parquet bytes

    @property
    def lengths(self) -> list[int]:
        return [len(x) for x in self.input_ids]

    def __len__(self) -> int:
        return len(self.prompt_ids)


def read_token_rows(path: Path) -> TokenRows:
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from draftgate import cache

    sha = cache.file_sha256(Path(path))
    pids: list[str] = []
    ids: list[Any] = []
    masks: list[Any] = []
    for batch in pq.ParquetFile(path).iter_batches(columns=["prompt_id", "input_ids", "loss_mask", "quarantine_reason"]):
        kept = batch.filter(pc.is_null(batch.column("quarantine_reason")))
        pids.extend(kept.column("prompt_id").to_pylist())
        for col, out, dtype in (("input_ids", ids, np.int64), ("loss_mask", masks, np.uint8)):
            arr = kept.column(col)
            # flatten() honours a sliced array's offset (.values would not); offsets stay absolute.
            flat = arr.flatten().to_numpy(zero_copy_only=False).astype(dtype)
            offs = arr.offsets.to_numpy()
            out.extend(flat[offs[i] - offs[0]:offs[i + 1] - offs[0]] for i in range(len(arr)))
    if len(set(pids)) != len(pids):
        raise ShardError(f"{path}: duplicate prompt_id among kept rows; the tokens gate should have failed")
    for pid, x, m in zip(pids, ids, masks):
        if len(x) != len(m) or len(x) == 0:
            raise ShardError(f"{path}: row {pid} has {len(x)} ids and {len(m)} mask values; rerun reconstruct")
    return TokenRows(pids, ids, masks, sha)


# ---------------------------------------------------------------- plan

@dataclass(frozen=True)
class ShardPlan:
    name: str
    rows: list[int]               # table positions, in stored order
    batches: list[list[int]]      # table positions per forward pass


def bytes_per_token(hidden_size: int, dtype: str) -> int:
    """(3 aux + 1 final) x H x itemsize: the features; ids (8) and mask (1) come on top."""
    return 4 * hidden_size * ITEMSIZE[dtype]


def plan_shards(lengths: Sequence[int], prompt_ids: Sequence[str], hidden_size: int, dtype: str,
                shard_max_mb: float, batch_tokens: int) -> list[ShardPlan]:
    from draftgate.hidden.capture import plan_batches

    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    per_token = bytes_per_token(hidden_size, dtype) + 9
    budget = shard_max_mb * MB
    groups: list[list[int]] = []
    current: list[int] = []
    size = _HEADER_BYTES
    for i in order:
        cost = lengths[i] * per_token + 8 + len(prompt_ids[i]) + 4
        if current and size + cost > budget:     # a row over the budget goes alone
            groups.append(current)
            current, size = [], _HEADER_BYTES
        current.append(i)
        size += cost
    if current:
        groups.append(current)
    plans = []
    for k, g in enumerate(groups):
        batches = [[g[j] for j in b] for b in plan_batches([lengths[i] for i in g], batch_tokens)]
        plans.append(ShardPlan(shard_name(k), g, batches))
    return plans


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.safetensors"


def sidecar(directory: Path, name: str) -> Path:
    return directory / (name.removesuffix(".safetensors") + ".json")


def assigned(plans: Sequence[ShardPlan], rank: int, world: int) -> list[ShardPlan]:
    """Rank r extracts shards r, r + world, ...: length-sorted shards dealt round-robin balance the tokens."""
    return [p for k, p in enumerate(plans) if k % world == rank]


# ---------------------------------------------------------------- write

def shard_bytes(rows: TokenRows, plan: ShardPlan, features: dict[int, tuple[Any, Any]]) -> bytes:
    """The safetensors bytes of one shard; `features[i]` = (aux [T,3,H], final [T,H]) of table row i."""
    import numpy as np
    import torch

    from draftgate.io import safetensors_bytes

    lengths = [len(rows.input_ids[i]) for i in plan.rows]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tensors = {
        "input_ids": torch.from_numpy(np.concatenate([rows.input_ids[i] for i in plan.rows])),
        "loss_mask": torch.from_numpy(np.concatenate([rows.loss_mask[i] for i in plan.rows])),
        "row_offsets": torch.from_numpy(offsets),
        "aux": torch.cat([features[i][0] for i in plan.rows]).contiguous(),
        "final": torch.cat([features[i][1] for i in plan.rows]).contiguous(),
    }
    meta = {"format": FORMAT, "prompt_ids": json.dumps([rows.prompt_ids[i] for i in plan.rows])}
    # Ours, not safetensors' `save`: its metadata order changes per process (draftgate/io.py).
    return safetensors_bytes(tensors, meta)


def write_shard(directory: Path, plan: ShardPlan, data: bytes, key: dict[str, Any]) -> dict[str, Any]:
    """The shard (temp name, fsync, rename), then its sidecar record (the same way): a crash
    between the two leaves a shard without a record, which resume recomputes."""
    target = directory / plan.name
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    tokens = _tokens_in(data)
    record = {"name": plan.name, "sha256": hashlib.sha256(data).hexdigest(), "rows": len(plan.rows),
              "tokens": tokens, "bytes": len(data)}
    write_json(sidecar(directory, plan.name), {"key": key, "shard": record})
    return record


def _tokens_in(data: bytes) -> int:
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    return int(header["input_ids"]["shape"][0])


# ---------------------------------------------------------------- resume

def stored_prompt_ids(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != FORMAT:
        raise ShardError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return json.loads(meta["prompt_ids"])


@dataclass
class Resume:
    trusted: dict[str, dict[str, Any]] = field(default_factory=dict)   # name -> shard record
    removed: list[str] = field(default_factory=list)


def resume(directory: Path, plans: Sequence[ShardPlan], rows: TokenRows, key: dict[str, Any]) -> Resume:
    """Keep what can be proven, remove the rest. Run by one process (rank 0) before any extraction.

    A finished run's manifest is turned back into sidecars for its trusted shards, then removed with
    the index: from here until the merge, the directory holds no manifest, so no reader can take a
    half-updated artifact for a finished one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict[str, Any]] = {}
    manifest = _read_json(directory / MANIFEST)
    if manifest and manifest.get("key") == key:
        records.update({s["name"]: s for s in manifest.get("shards", [])})
    for plan in plans:
        side = _read_json(sidecar(directory, plan.name))
        if side and side.get("key") == key and isinstance(side.get("shard"), dict):
            records[plan.name] = side["shard"]
    out = Resume()
    for plan in plans:
        rec = records.get(plan.name)
        path = directory / plan.name
        if not rec or not path.is_file() or path.stat().st_size != rec.get("bytes"):
            continue
        try:
            ok = file_sha256(path) == rec["sha256"] and \
                stored_prompt_ids(path) == [rows.prompt_ids[i] for i in plan.rows]
        except Exception:   # any unreadable shard is simply recomputed
            ok = False
        if ok:
            out.trusted[plan.name] = rec
            write_json(sidecar(directory, plan.name), {"key": key, "shard": rec})
    keep = set(out.trusted) | {sidecar(directory, n).name for n in out.trusted}
    for p in sorted(directory.iterdir()):
        if p.is_file() and p.name not in keep:
            out.removed.append(p.name)
            p.unlink()
    return out


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# ---------------------------------------------------------------- merge

def merge(directory: Path, plans: Sequence[ShardPlan], rows: TokenRows, key: dict[str, Any],
          manifest_fields: dict[str, Any]) -> dict[str, Any]:
    """index.parquet, then manifest.json (last), from every shard's sidecar; then drop the sidecars."""
    import pyarrow as pa

    from draftgate.io import write_parquet

    records = []
    where: dict[int, tuple[str, int, int, int]] = {}
    for plan in plans:
        side = _read_json(sidecar(directory, plan.name))
        path = directory / plan.name
        if not side or side.get("key") != key or not path.is_file() or path.stat().st_size != side["shard"]["bytes"]:
            raise ShardError(f"{path}: missing or without its record after extraction; rerun the hidden stage")
        records.append(side["shard"])
        offset = 0
        for r, i in enumerate(plan.rows):
            n = len(rows.input_ids[i])
            where[i] = (plan.name, r, offset, n)
            offset += n
    order = range(len(rows))
    index = pa.table({
        "prompt_id": pa.array([rows.prompt_ids[i] for i in order], pa.string()),
        "shard": pa.array([where[i][0] for i in order], pa.string()),
        "row": pa.array([where[i][1] for i in order], pa.int32()),
        "offset": pa.array([where[i][2] for i in order], pa.int64()),
        "length": pa.array([where[i][3] for i in order], pa.int64()),
    })
    write_parquet(directory / INDEX, index)
    manifest = {**manifest_fields, "format": FORMAT, "key": key, "rows": len(rows),
                "tokens": int(sum(rows.lengths)), "shards": records}
    write_json(directory / MANIFEST, manifest)
    for plan in plans:
        sidecar(directory, plan.name).unlink(missing_ok=True)
    return manifest


def write_online(directory: Path, rows: TokenRows, key: dict[str, Any], manifest_fields: dict[str, Any]) -> dict[str, Any]:
    """Online mode: no tensors; an index with null shards and a manifest saying what would be captured."""
    import pyarrow as pa

    from draftgate.io import write_parquet

    directory.mkdir(parents=True, exist_ok=True)
    for p in directory.iterdir():
        if p.is_file():
            p.unlink()
    lengths = rows.lengths
    index = pa.table({
        "prompt_id": pa.array(rows.prompt_ids, pa.string()),
        "shard": pa.array([None] * len(rows), pa.string()),
        "row": pa.array([None] * len(rows), pa.int32()),
        "offset": pa.array([None] * len(rows), pa.int64()),
        "length": pa.array(lengths, pa.int64()),
    })
    write_parquet(directory / INDEX, index)
    manifest = {**manifest_fields, "format": FORMAT, "key": key, "rows": len(rows),
                "tokens": int(sum(lengths)), "shards": []}
    write_json(directory / MANIFEST, manifest)
    return manifest
