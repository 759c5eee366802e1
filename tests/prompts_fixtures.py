"""Prompt ingestion as the prompts stage runs it, on records built in a test.

The records are written as raw JSONL files (one per `RawRecord.file`, lines in `index` order),
read back with `raw_files` + `read_raw` and streamed through `ingest_to_files`, exactly the
stage's path; the two tables it writes come back in memory with its tally.
"""

from __future__ import annotations

import random
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from draftgate.config import PromptsParams
from draftgate.prompts import RawRecord, Tally, raw_files, read_raw
from draftgate.prompts.stream import ingest_to_files


@dataclass(frozen=True)
class Ingested:
    prompts: Any        # prompts.parquet as written (pyarrow Table)
    rejects: Any        # rejects.parquet as written
    tally: Tally

    @property
    def rows(self) -> list[dict]:
        return self.prompts.to_pylist()

    @property
    def reject_rows(self) -> list[dict]:
        return self.rejects.to_pylist()


def write_raw(records: Iterable[RawRecord], raw_dir: Path) -> None:
    """One JSONL file per record file; a file's records must number its lines 1..n."""
    by_file: dict[str, dict[int, bytes]] = defaultdict(dict)
    for r in records:
        assert isinstance(r.data, bytes), f"{r.source}: only JSONL records (bytes) can be written"
        assert r.index not in by_file[r.file], f"{r.source} given twice"
        by_file[r.file][r.index] = r.data
    raw_dir.mkdir(parents=True, exist_ok=True)
    for name, lines in by_file.items():
        assert sorted(lines) == list(range(1, len(lines) + 1)), f"{name}: lines {sorted(lines)} are not 1..n"
        (raw_dir / name).write_bytes(b"".join(lines[i] + b"\n" for i in sorted(lines)))


def ingest(records: Iterable[RawRecord], params: PromptsParams,
           render_problem: Callable[[list[dict], list[dict] | None, bool], str | None] | None = None) -> Ingested:
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as d:
        raw, out = Path(d) / "raw", Path(d) / "out"
        records = list(records)
        write_raw(records, raw)
        stream = (r for path in (raw_files(raw) if records else []) for r in read_raw(path))
        tally = ingest_to_files(stream, params, out, render_problem)
        return Ingested(pq.read_table(out / "prompts.parquet"), pq.read_table(out / "rejects.parquet"), tally)


def shuffled_lines(records: list[RawRecord], seed: int) -> list[RawRecord]:
    """The same records with each file's lines in another order (renumbered 1..n)."""
    rng, out = random.Random(seed), []
    by_file: dict[str, list[RawRecord]] = defaultdict(list)
    for r in records:
        by_file[r.file].append(r)
    for name, recs in by_file.items():
        recs = rng.sample(recs, len(recs))
        out.extend(RawRecord(name, i, r.data) for i, r in enumerate(recs, start=1))
    return out
