"""Extraction: the planned shards of one rank, captured batch by batch and written atomically.

Rows in `reuse` (table positions whose ids equal the repair stage's prefill) are copied from it;
each planned batch forwards only its other rows (docs/repair.md, "One prefill for two stages")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from draftgate.hidden.shards import ShardPlan, TokenRows, shard_bytes, write_shard


@dataclass
class ExtractStats:
    shards: int = 0
    rows: int = 0
    tokens: int = 0               # tokens forwarded here (not those copied from the prefill)
    reused_rows: int = 0          # rows copied from the prefill
    reused_tokens: int = 0
    padded_tokens: int = 0        # rows x longest row, summed over forward passes
    bytes: int = 0
    forward_s: float = 0.0
    write_s: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def capture_batch(target: Any, rows: TokenRows, batch: Sequence[int], layers: Sequence[int],
                  dtype: str) -> dict[int, tuple[Any, Any]]:
    """Features of the table rows in `batch`, captured together (right-padded), cut to their lengths."""
    import torch

    from draftgate.hidden.capture import capture_rows

    ids = [torch.from_numpy(rows.input_ids[i]) for i in batch]
    return dict(zip(batch, capture_rows(target, ids, layers, torch_dtype(dtype))))


def extract(target: Any, rows: TokenRows, plans: Sequence[ShardPlan], layers: Sequence[int], dtype: str,
            directory: Path, key: dict[str, Any],
            on_shard: Callable[[dict[str, Any]], None] | None = None,
            prefill: Any = None, reuse: frozenset[int] = frozenset()) -> ExtractStats:
    stats = ExtractStats()
    for plan in plans:
        start = time.perf_counter()
        features = {i: prefill.features(rows.prompt_ids[i]) for i in plan.rows if i in reuse}
        for batch in plan.batches:
            todo = [i for i in batch if i not in reuse]
            if todo:
                features.update(capture_batch(target, rows, todo, layers, dtype))
                stats.padded_tokens += len(todo) * max(len(rows.input_ids[i]) for i in todo)
        mid = time.perf_counter()
        record = write_shard(directory, plan, shard_bytes(rows, plan, features), key)
        stats.write_s += time.perf_counter() - mid
        stats.forward_s += mid - start
        stats.shards += 1
        stats.rows += record["rows"]
        copied = [len(rows.input_ids[i]) for i in plan.rows if i in reuse]
        stats.reused_rows += len(copied)
        stats.reused_tokens += sum(copied)
        stats.tokens += record["tokens"] - sum(copied)
        stats.bytes += record["bytes"]
        stats.records.append(record)
        if on_shard is not None:
            on_shard(record)
    return stats
