"""Prompt ingestion in bounded memory: raw files -> prompts.parquet + rejects.parquet, streamed.

Each record is decided by `prompts.decide`; the first occurrence of a prompt id wins, later ones
count as its duplicates; `max_prompts` keeps the lowest ids; the split is `split_of(id, seed)`.
Records arrive in (file, line) order, as `raw_files` and `read_raw` give them, so "first wins"
means first by file name, then line, and needs no sort. Pass 1 writes each new prompt (with its split)
and each reject to part files as it is decided, and remembers per prompt only a 16-byte digest of
its id (duplicate counts live in a Counter of the few ids seen twice, the cap in a heap of
`max_prompts` ids). Pass 2 streams the part file into prompts.parquet, filling `n_duplicates` and
dropping capped rows. Memory: ~80 bytes per distinct prompt plus one batch.
"""

from __future__ import annotations

import heapq
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from draftgate.config import PromptsParams
from draftgate.prompts import Problem, Prompt, RawRecord, Reject, Tally, conversation_id, decide, split_of

BATCH = 8192


def ingest_to_files(records: Iterable[RawRecord], params: PromptsParams, out_dir: Path,
                    render_problem: Problem | None = None, default_thinking: bool = False) -> Tally:
    """`default_thinking`: template.thinking, the mode of a dataset prompts.thinking does not name."""
    import os
    import shutil
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate import schema

    # Params from params.yaml are range-checked already; these guard a caller that builds them.
    if not 0.0 <= params.heldout_fraction <= 1.0:
        raise ValueError(f"prompts.heldout_fraction is {params.heldout_fraction}; it must be within [0, 1]")
    if params.max_prompts is not None and params.max_prompts < 0:
        raise ValueError(f"prompts.max_prompts is {params.max_prompts}; use null for no cap or a count >= 0")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Everything is written in a staging folder beside out_dir and moved in at the end: a failed
    # run leaves no prompts.parquet that looks complete (nor an out_dir at all on a first run).
    stage = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.staging-"))
    part = stage / "prompts.parquet.part"
    tally = Tally()
    seen: set[bytes] = set()
    dups: Counter = Counter()
    cap = params.max_prompts
    lowest: list[str] = []     # a max-heap (negated) of the `cap` lowest ids seen, when capped
    dropped_final: set[str] = set()   # ids whose record ended on an assistant turn (few)
    rows: list[dict] = []
    rejects: list[dict] = []
    modes = _modes(params, default_thinking)
    try:
        with pq.ParquetWriter(part, schema.prompts()) as pw, \
                pq.ParquetWriter(stage / "rejects.parquet", schema.rejects()) as rw:
            for r in records:
                decided = decide(r, render_problem, modes)
                if decided is None:
                    tally.blank_lines += 1
                    continue
                tally.rows_in += 1
                tally.per_dataset_in[Path(r.file).stem] += 1
                for out in decided:
                    if isinstance(out, Reject):
                        tally.reject(out)
                        rejects.append({"source": out.source, "reason": out.reason, "detail": out.detail,
                                        "record": out.record})
                        if len(rejects) >= BATCH:
                            rw.write_table(pa.Table.from_pylist(rejects, schema=schema.rejects()))
                            rejects = []
                        continue
                    digest = bytes.fromhex(out.prompt_id)[:16]
                    if digest in seen:
                        dups[out.prompt_id] += 1
                        continue
                    seen.add(digest)
                    if out.dropped_final_assistant:
                        dropped_final.add(out.prompt_id)
                    if cap is not None:
                        if len(lowest) < cap:
                            heapq.heappush(lowest, _Desc(out.prompt_id))
                        elif cap and out.prompt_id < lowest[0].id:
                            heapq.heapreplace(lowest, _Desc(out.prompt_id))
                    rows.append(_row(out, params))
                    if len(rows) >= BATCH:
                        pw.write_table(pa.Table.from_pylist(rows, schema=schema.prompts()))
                        rows = []
            if rows:
                pw.write_table(pa.Table.from_pylist(rows, schema=schema.prompts()))
            if rejects:
                rw.write_table(pa.Table.from_pylist(rejects, schema=schema.rejects()))
        tally.n_duplicates = sum(dups.values())
        # The ids are hashes, so the lowest ids are a uniform sample across datasets.
        threshold = max((d.id for d in lowest), default=None) if cap is not None and len(seen) > cap else None
        if cap == 0:
            threshold = ""
        with pq.ParquetWriter(stage / "prompts.parquet", schema.prompts()) as w:
            for batch in pq.ParquetFile(part).iter_batches(batch_size=BATCH):
                t = pa.Table.from_batches([batch])
                rows = t.to_pylist()
                kept = [x for x in rows if threshold is None or x["prompt_id"] <= threshold]
                tally.n_capped += len(rows) - len(kept)
                for x in kept:
                    x["n_duplicates"] = dups.get(x["prompt_id"], 0)
                    tally.keep(x["dataset"], x["split"], x["tools"] is not None, x["prompt_id"] in dropped_final,
                               x["thinking"])
                if kept:
                    w.write_table(pa.Table.from_pylist(kept, schema=schema.prompts()))
        out_dir.mkdir(exist_ok=True)
        for name in ("rejects.parquet", "prompts.parquet"):
            os.replace(stage / name, out_dir / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return tally


class _Desc:
    """Heap entry ordered descending by id: heapq's min-heap then holds the largest on top."""
    __slots__ = ("id",)

    def __init__(self, id_: str):
        self.id = id_

    def __lt__(self, other: _Desc) -> bool:
        return self.id > other.id


def _modes(params: PromptsParams, default: bool):
    """dataset -> the thinking settings its records are served in when they name none."""
    table = {d: (True, False) if v == "both" else (bool(v),) for d, v in params.thinking.items()}
    fallback = (default,)
    return lambda dataset: table.get(dataset, fallback)


def _row(p: Prompt, params: PromptsParams) -> dict[str, Any]:
    import json

    # The split hashes the conversation, never the mode: both modes of a prompt share a side.
    key = conversation_id(json.loads(p.messages), json.loads(p.tools) if p.tools else None)
    if params.split_by == "last_user":
        # Same normalised question, same side of the split (contamination.py).
        from draftgate.prompts.contamination import group_key

        key = group_key(json.loads(p.messages))
    return {"prompt_id": p.prompt_id, "dataset": p.dataset, "messages": p.messages, "tools": p.tools,
            "split": split_of(key, params.split_seed, params.heldout_fraction), "source": p.source,
            "n_duplicates": 0, "thinking": bool(p.thinking)}
