"""One reader interface over stored (offline) or on-demand (online) hidden states.

Consumers (the drafter's training loop, the gates) take a `FeatureSource` and never ask which mode
produced it: `OfflineFeatures` reads the shards through the index; `OnlineFeatures` runs the same
capture code (draftgate/hidden/capture.py) with the target resident on its device, grouping rows
into the same forward batches as the offline plan, so both yield identical tensors for a row
(docs/hidden-states.md, "Online mode").
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

from draftgate.hidden.shards import FORMAT, INDEX, MANIFEST, ShardError, TokenRows, plan_shards
from draftgate.io import file_sha256


@dataclass
class Sample:
    prompt_id: str
    input_ids: Any        # LongTensor [T]
    loss_mask: Any        # BoolTensor [T]
    aux: Any              # [T, 3, H]
    final: Any            # [T, H], before the final norm


class FeatureSource(Protocol):
    prompt_ids: list[str]
    hidden_size: int
    layers: tuple[int, int, int]
    dtype: str

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Sample: ...

    def get(self, prompt_id: str) -> Sample: ...


def read_manifest(directory: Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ShardError(f"{path}: not found; the hidden stage has not finished (dvc repro hidden)") from None
    except ValueError as e:
        raise ShardError(f"{path}: not JSON ({e}); rerun the hidden stage") from None
    if manifest.get("format") != FORMAT:
        raise ShardError(f"{path}: format {manifest.get('format')!r}, this reader knows {FORMAT!r}")
    return manifest


class OfflineFeatures:
    """Shards read through index.parquet. Opening checks the manifest against the files (names,
    sizes, row counts) and, given `tokens_path`, that they were made from that tokens table;
    `verify_hashes` also checks each shard's sha256 when first loaded (the hidden gate always does)."""

    def __init__(self, directory: str | Path, tokens_path: str | Path | None = None, verify_hashes: bool = False):
        import pyarrow.parquet as pq

        from draftgate import cache

        self.directory = Path(directory)
        self.manifest = m = read_manifest(self.directory)
        if m.get("mode") == "online":
            raise ShardError(f"{self.directory}: an online-mode manifest (no tensors); open it with "
                             "open_features(..., target=...) to capture on demand")
        if tokens_path is not None and cache.file_sha256(Path(tokens_path)) != m["tokens_sha256"]:
            raise ShardError(f"{self.directory}: made from another tokens table than {tokens_path}; "
                             "rerun the hidden stage")
        self.records = {s["name"]: s for s in m["shards"]}
        for name, rec in self.records.items():
            path = self.directory / name
            if not path.is_file() or path.stat().st_size != rec["bytes"]:
                raise ShardError(f"{path}: missing or not the size the manifest records; rerun the hidden stage")
        index = pq.read_table(self.directory / INDEX).to_pydict()
        self.prompt_ids: list[str] = index["prompt_id"]
        self._where = list(zip(index["shard"], index["row"], index["offset"], index["length"]))
        self._pos = {p: i for i, p in enumerate(self.prompt_ids)}
        if len(self._pos) != len(self.prompt_ids) or len(self.prompt_ids) != m["rows"]:
            raise ShardError(f"{self.directory}: index has {len(self.prompt_ids)} lines "
                             f"({len(self._pos)} distinct) for {m['rows']} rows; rerun the hidden stage")
        self.hidden_size = int(m["model"]["hidden_size"])
        self.layers = tuple(m["layers"]["eagle3"])
        self.dtype = m["dtype"]
        self.verify_hashes = verify_hashes
        self._shard: tuple[str, dict[str, Any], list[int]] | None = None

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def order(self) -> list[int]:
        """Positions in storage order: iterating them loads each shard once."""
        return sorted(range(len(self)), key=lambda i: (self._where[i][0], self._where[i][2]))

    def _load(self, name: str) -> tuple[str, dict[str, Any], list[int]]:
        from safetensors.torch import load_file

        path = self.directory / name
        if self.verify_hashes and file_sha256(path) != self.records[name]["sha256"]:
            raise ShardError(f"{path}: sha256 differs from the manifest; rerun the hidden stage")
        tensors = load_file(str(path))
        tensors["loss_mask"] = tensors["loss_mask"].bool()     # once a shard, not once a row
        self._shard = (name, tensors, tensors["row_offsets"].tolist())
        return self._shard

    def __getitem__(self, i: int) -> Sample:
        name, row, offset, length = self._where[i]
        shard = self._shard
        if shard is None or shard[0] != name:
            shard = self._load(name)
        t, offsets = shard[1], shard[2]
        if offsets[row] != offset or offsets[row + 1] != offset + length:
            raise ShardError(f"{self.directory / name}: row {row} is not where the index says; rerun the hidden stage")
        end = offset + length
        return Sample(self.prompt_ids[i], t["input_ids"][offset:end], t["loss_mask"][offset:end],
                      t["aux"][offset:end], t["final"][offset:end])

    def get(self, prompt_id: str) -> Sample:
        return self[self._pos[prompt_id]]

    def __iter__(self) -> Iterator[Sample]:
        return (self[i] for i in range(len(self)))


class OnlineFeatures:
    """Features captured on demand by the resident target. With `batch_tokens` and `shard_max_mb`
    (the offline params) a row is captured inside the very batch the offline plan puts it in, so
    the tensors equal the stored ones bit for bit on the same device; the last `keep_batches`
    batches are kept, so reading in `order()` runs each forward pass once."""

    def __init__(self, target: Any, tokens_rows: TokenRows, layers: Sequence[int], dtype: str,
                 batch_tokens: int | None = None, shard_max_mb: float | None = None, keep_batches: int = 4):
        self.target, self.rows = target, tokens_rows
        self.prompt_ids = list(tokens_rows.prompt_ids)
        self.hidden_size = int(target.hidden_size)
        self.layers = tuple(int(i) for i in layers)
        self.dtype = dtype
        self._pos = {p: i for i, p in enumerate(self.prompt_ids)}
        if batch_tokens is not None and shard_max_mb is not None:
            plans = plan_shards(tokens_rows.lengths, self.prompt_ids, self.hidden_size, dtype, shard_max_mb, batch_tokens)
            batches = [b for p in plans for b in p.batches]
        else:
            batches = [[i] for i in range(len(self.prompt_ids))]
        self._batches = batches
        self._batch_of = {i: k for k, b in enumerate(batches) for i in b}
        self._cache: OrderedDict[int, dict[int, tuple[Any, Any]]] = OrderedDict()
        self._keep = max(1, keep_batches)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def order(self) -> list[int]:
        return [i for b in self._batches for i in b]

    def __getitem__(self, i: int) -> Sample:
        import torch

        from draftgate.hidden.extract import capture_batch

        k = self._batch_of[i]
        if k not in self._cache:
            self._cache[k] = capture_batch(self.target, self.rows, self._batches[k], self.layers, self.dtype)
            while len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        self._cache.move_to_end(k)
        aux, final = self._cache[k][i]
        return Sample(self.prompt_ids[i], torch.from_numpy(self.rows.input_ids[i]),
                      torch.from_numpy(self.rows.loss_mask[i]).bool(), aux, final)

    def get(self, prompt_id: str) -> Sample:
        return self[self._pos[prompt_id]]

    def __iter__(self) -> Iterator[Sample]:
        return (self[i] for i in range(len(self)))


def open_features(hidden_params: Any, hidden_dir: str | Path, tokens_path: str | Path,
                  target: Any = None) -> FeatureSource:
    """The hidden stage's artifact as a FeatureSource: stored shards (offline) or, for an online
    manifest, the same capture on demand with `target` (loaded from the params when None)."""
    from draftgate.hidden.shards import read_token_rows

    manifest = read_manifest(Path(hidden_dir))
    if manifest.get("mode") != "online":
        return OfflineFeatures(hidden_dir, tokens_path)
    rows = read_token_rows(Path(tokens_path))
    if rows.sha256 != manifest["tokens_sha256"]:
        raise ShardError(f"{hidden_dir}: its manifest names another tokens table than {tokens_path}; "
                         "rerun the hidden stage")
    if target is None:
        from draftgate.target import load_target

        target = load_target(hidden_params)
    if target.weights_fingerprint != manifest["model"]["weights_fingerprint"]:
        raise ShardError(f"{hidden_dir}: the manifest names weights {manifest['model']['weights_fingerprint'][:16]}, "
                         f"the target is {target.weights_fingerprint[:16]}; rerun the hidden stage")
    plan = manifest.get("plan", {})
    return OnlineFeatures(target, rows, manifest["layers"]["eagle3"], manifest["dtype"],
                          plan.get("batch_tokens"), plan.get("shard_max_mb"))
