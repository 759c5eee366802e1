"""The table a gate validates: named inputs -> only the columns the suite reads -> pandas.

Inputs are Parquet (a file, a glob or a directory of shards), JSONL, or a JSON document (the list
under the suite's "table" key). A plain Parquet artifact is read by pyarrow; a suite `view`, JSONL
and JSON go through DuckDB, where every input is a relation named after it. Either way only the
projected columns are decoded, so a tokens table's id lists are never materialised unless a check
reads them. Each input is fingerprinted (rows, files, bytes, sha256) for the gate's result.
"""

from __future__ import annotations

import glob
import hashlib
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from draftgate.gates.suite import NAME_RE, GateError


@dataclass(frozen=True)
class Input:
    name: str
    path: str


def parse_input(text: str, default_name: str) -> Input:
    name, sep, path = text.partition("=")
    if sep and NAME_RE.match(name):
        return Input(name, path)
    return Input(default_name, text)


def input_files(inp: Input) -> list[Path]:
    p = Path(inp.path)
    if any(ch in inp.path for ch in "*?["):
        files = sorted(Path(f) for f in glob.glob(inp.path))
    elif p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in (".parquet", ".jsonl", ".ndjson"))
    else:
        files = [p] if p.is_file() else []
    if not files:
        raise GateError(f"input {inp.name!r}: {inp.path} does not exist (or matches no file); "
                        "run the stage that produces it or fix the path")
    return files


def file_facts(files: list[Path]) -> dict:
    digests = []
    for f in files:
        with open(f, "rb") as fh:
            digests.append(hashlib.file_digest(fh, "sha256").hexdigest())
    sha = digests[0] if len(digests) == 1 else hashlib.sha256(
        "".join(f"{f.name}\0{d}\n" for f, d in zip(files, digests)).encode()).hexdigest()
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files), "sha256": sha}


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def register_input(con, inp: Input, files: list[Path], table_key: str | None) -> None:
    """Make `inp.name` a DuckDB relation over the files (lazy for Parquet/JSONL)."""
    import duckdb

    suffix = files[0].suffix.lower()
    listing = "[" + ", ".join(_sql_str(str(f)) for f in files) + "]"
    try:
        if suffix == ".parquet":
            con.execute(f"CREATE VIEW {_ident(inp.name)} AS SELECT * FROM read_parquet({listing})")
        elif suffix in (".jsonl", ".ndjson"):
            con.execute(f"CREATE VIEW {_ident(inp.name)} AS SELECT * FROM "
                        f"read_json({listing}, format='newline_delimited')")
        elif suffix == ".json" and table_key is None and _is_object(files[0]):
            # A side input that is one JSON document (contract.json): one row, nested fields as
            # structs, e.g. `SELECT roles.end_id FROM contract`.
            # The reader's buffer is sized by maximum_object_size (twice it): the file's own size,
            # not a fixed 256 MB that DuckDB's memory limit (DUCKDB_MEMORY) would refuse.
            size = max(files[0].stat().st_size + 1, 1 << 20)
            con.execute(f"CREATE VIEW {_ident(inp.name)} AS SELECT * FROM read_json({listing}, "
                        f"format='unstructured', maximum_object_size={size})")
        elif suffix == ".json":
            con.register(inp.name, json_table(inp, files[0], table_key))
        else:
            raise GateError(f"input {inp.name!r}: {files[0]}: unsupported format {suffix!r}; "
                            "gates read .parquet, .jsonl/.ndjson and .json")
        con.sql(f"DESCRIBE {_ident(inp.name)}").fetchall()  # reads the schema now: fail here, not later
    except duckdb.Error as e:
        raise GateError(f"input {inp.name!r}: {inp.path}: unreadable as {suffix[1:]}: {_one_line(e)}; "
                        "regenerate the file with the stage that writes it") from None


def _is_object(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(64).lstrip()[:1] == b"{"


def json_table(inp: Input, path: Path, table_key: str | None):
    import pyarrow as pa

    try:
        doc = json.loads(path.read_bytes())
    except ValueError as e:
        raise GateError(f"input {inp.name!r}: {path}: not valid JSON ({e})") from None
    rows = doc
    if table_key is not None:
        if not isinstance(doc, dict) or table_key not in doc:
            keys = ", ".join(doc) if isinstance(doc, dict) else type(doc).__name__
            raise GateError(f"input {inp.name!r}: {path}: no key {table_key!r} (suite \"table\"); found: {keys}")
        rows = doc[table_key]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        hint = "set the suite's \"table\" to the key of a list of objects" if table_key is None else \
            f"{table_key!r} must be a list of JSON objects"
        raise GateError(f"input {inp.name!r}: {path}: not a table; {hint}")
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise GateError(f"input {inp.name!r}: {path}: rows do not share one type per field: {_one_line(e)}") from None


# ------------------------------------------------------------ the validated table

# Rows GX validates at a time (merge.py merges the batches' results). A tokens view row is ~0.3 KB
# in pandas, a prompts row with its messages ~0.5 KB: a batch stays in the tens of MB whatever the
# table's size (docs/great-expectations.md, "Gates in bounded memory").
BATCH_ROWS = 32_768
# DuckDB's own memory for a view's joins, windows and group-bys: beyond it DuckDB spills to a
# temporary directory rather than grow with the table. An operator that cannot spill and needs
# more makes the statement retry with twice the limit (DuckSource.grown), so the cap costs memory,
# never a verdict. 128 MB: the responses view's windows over 500K rows held ~220 MB at 256 (peak
# RSS 1.56x that of 50K rows) and spill at 128 (1.41x). A view that aggregates all rows and joins
# the figures back holds its rows before the first comes out; the tokens suite computes those
# figures as relations (suite.Relation) instead, and its rows stream (1.31x, bench/scale.py). The
# doubling stops at 4 GB.
DUCKDB_MEMORY_MB = 128
DUCKDB_RETRIES = 5


@dataclass
class Loaded:
    source: "Source"               # the table, read batch by batch (Loaded.batches)
    columns: list[str]             # every column of the validated table
    loaded: list[str]              # the ones materialised
    inputs: list[dict]             # name, path, rows of each input
    files: list[list[Path]]        # each input's files, for fingerprints()
    order: list[str]               # the frame's columns (loaded ones, or every name as placeholders)
    rows: int = 0                  # counted as the batches go by
    batch_rows: list[int] = field(default_factory=list)
    value_hashes: dict[str, list] = field(default_factory=dict)   # column -> [(hashes, non-null)] per batch

    def batches(self, size: int | None = None, unique: tuple[str, ...] = ()) -> Iterator[Any]:
        """pandas frames of `size` rows (the last one shorter; one empty frame for an empty table),
        in table order. `size` None: the whole table as one frame. `unique`: columns whose values
        are hashed as they go by (8 bytes a row), for `duplicates` across batches."""
        self.rows, self.batch_rows = 0, []
        self.value_hashes: dict[str, list] = {c: [] for c in unique}
        for arrow in _rechunk(self.source.arrow_batches(self.loaded), size):
            if arrow is None:    # no column read: frames of placeholders, as many rows as the table
                total = self.source.count()
                step = size or max(total, 1)
                for n in [min(step, total - i) for i in range(0, total, step)] or [0]:
                    self.rows += n
                    self.batch_rows.append(n)
                    yield to_frame(None, n, self.order)
                return
            self.rows += arrow.num_rows
            self.batch_rows.append(arrow.num_rows)
            frame = to_frame(arrow, arrow.num_rows, self.order)
            for c, parts in self.value_hashes.items():
                if c in frame.columns:
                    parts.append(_value_hashes(frame[c]))
            yield frame

    def duplicates(self, column: str, sample: int):
        """merge.Duplicates of `column` over the whole table (a uniqueness check across batches).

        GX's rule: every row whose non-null value occurs more than once. The rows are found by the
        values' 64-bit hashes taken in `batches` (a collision can only add a row, never hide a
        duplicate: a pass is exact); the sample's values are read back in a second pass over that
        one column, only when there is a duplicate.
        """
        import numpy as np

        from draftgate.gates.merge import Duplicates

        parts = self.value_hashes.get(column) or []
        if not parts:
            return Duplicates(count=0, sample=[])
        hashes = np.concatenate([h for h, _ in parts])
        present = np.concatenate([m for _, m in parts])
        _, inverse, counts = np.unique(hashes[present], return_inverse=True, return_counts=True)
        repeated = counts[inverse] > 1
        count = int(repeated.sum())
        if not count:
            return Duplicates(count=0, sample=[])
        wanted = np.flatnonzero(present)[repeated][:sample].tolist()
        values, start = [], 0
        for arrow in _rechunk(self.source.arrow_batches([column]), BATCH_ROWS):
            end = start + arrow.num_rows
            col = to_frame(arrow, arrow.num_rows, [column])[column]
            values += [col.iloc[i - start] for i in wanted if start <= i < end]
            start = end
            if start > wanted[-1]:
                break
        return Duplicates(count=count, sample=values)

    def close(self) -> None:
        self.source.close()


def _value_hashes(series: Any) -> tuple[Any, Any]:
    """(64-bit hash of each value, whether it is non-null): equal values hash equal."""
    import pandas as pd

    present = series.notna().to_numpy()
    return pd.util.hash_pandas_object(series, index=False).to_numpy(), present


def fingerprints(loaded: Loaded) -> Future:
    """sha256/bytes of every input, hashed in a thread (hashlib releases the GIL).

    A 70 MB tokens file takes ~0.1 s of CPU; started after the read, it overlaps the GX import
    (single-threaded, 2-3 s) instead of competing with the reader's threads.
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
    job = pool.submit(lambda: [file_facts(files) for files in loaded.files])
    pool.shutdown(wait=False)
    return job


def load_table(inputs: list[Input], *, table_key: str | None = None, view: str | None = None,
               wanted: set[str] | None = None, all_names: bool = False, where: str = "suite",
               computed: dict[str, Any] | None = None, relations: tuple = ()) -> Loaded:
    """The validated table: the first input (or `view` over all inputs), only `wanted` columns.

    Nothing is read here but schemas and row counts: `Loaded.batches()` streams the rows.
    `all_names`: every column of the table appears (unread ones as null placeholders), for the
    table-level checks that compare column names. `computed`: relation name -> Arrow table, side
    tables a suite's producer made (compute.py), which the view reads beside the inputs.
    """
    files_of = [input_files(inp) for inp in inputs]
    facts = [{"name": inp.name, "path": inp.path} for inp in inputs]
    if view is None and not computed and len(inputs) == 1 and files_of[0][0].suffix.lower() == ".parquet":
        source: Source = ParquetSource(inputs[0], files_of[0])
        facts[0]["rows"] = source.count()
    else:
        source = DuckSource(inputs, files_of, facts, table_key, view, where, computed or {}, relations)
    columns = source.columns
    keep = [c for c in columns if wanted is None or c in wanted]
    return Loaded(source=source, columns=columns, loaded=keep, inputs=facts, files=files_of,
                  order=columns if all_names else keep)


def _rechunk(batches: Iterator[Any], size: int | None) -> Iterator[Any]:
    """Arrow record batches -> tables of exactly `size` rows (the last one shorter; None: one
    table of all), in order; a None batch (no column read) passes through as one None."""
    import pyarrow as pa

    held: list = []
    n, sent = 0, False
    for b in batches:
        if b is None:
            yield None
            return
        held.append(pa.Table.from_batches([b]))
        n += b.num_rows
        while size is not None and n >= size:
            table = pa.concat_tables(held)
            yield table.slice(0, size)
            sent = True
            rest = table.slice(size)
            held, n = ([rest] if rest.num_rows else []), rest.num_rows
    if held and (n or not sent):     # the rest; or the empty table (sources yield one empty batch)
        yield pa.concat_tables(held)


class Source:
    columns: list[str]

    def arrow_batches(self, keep: list[str]) -> Iterator[Any]:
        raise NotImplementedError

    def count(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _duck(tmp: list) -> Any:
    """A DuckDB connection whose memory is capped (it spills to a private temporary directory)."""
    import tempfile

    import duckdb

    con = duckdb.connect()
    tmp.append(tempfile.mkdtemp(prefix="draftgate-gate-"))
    con.execute(f"SET memory_limit = '{DUCKDB_MEMORY_MB}MB'")
    con.execute(f"SET temp_directory = {_sql_str(tmp[-1])}")
    return con


class ParquetSource(Source):
    """A plain Parquet artifact: pyarrow decodes the projected columns, a row group at a time."""

    def __init__(self, inp: Input, files: list[Path]):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.inp, self.files = inp, files
        try:
            # No pre-buffering: it keeps what it read, so memory would grow with the file.
            self.readers = [pq.ParquetFile(f, pre_buffer=False) for f in files]
            self.columns = list(self.readers[0].schema_arrow.names)
        except (pa.ArrowException, OSError) as e:
            raise GateError(f"input {inp.name!r}: {inp.path}: unreadable as parquet: {_one_line(e)}; "
                            "regenerate the file with the stage that writes it") from None

    def count(self) -> int:
        return sum(r.metadata.num_rows for r in self.readers)

    def arrow_batches(self, keep: list[str]) -> Iterator[Any]:
        import pyarrow as pa

        if not keep:
            yield None
            return
        try:
            for r in self.readers:
                for i in range(r.num_row_groups):
                    yield from r.read_row_group(i, columns=keep).to_batches()
            # Always a batch, if an empty one: the frame keeps its columns' types.
            yield pa.RecordBatch.from_pylist([], schema=pa.schema([self.readers[0].schema_arrow.field(c) for c in keep]))
        except (pa.ArrowException, OSError) as e:
            raise GateError(f"input {self.inp.name!r}: {self.inp.path}: unreadable as parquet: {_one_line(e)}; "
                            "regenerate the file with the stage that writes it") from None


class DuckSource(Source):
    """Views, JSONL, JSON documents: every input becomes a DuckDB relation named after it; the
    table streams out of DuckDB as Arrow batches."""

    def __init__(self, inputs, files_of, facts, table_key, view, where, computed, relations=()):
        self.tmp: list[str] = []
        self.con = _duck(self.tmp)
        self.where = where
        self.limit = DUCKDB_MEMORY_MB
        try:
            self.attach(inputs, files_of, facts, table_key, view, where, computed, relations)
        except BaseException:
            self.close()   # a view that does not run must not leave its spill directory behind
            raise

    def create(self, r: Any) -> None:
        """A suite's relation (suite.Relation), before the view that reads it."""
        import duckdb

        kind = "TABLE" if r.materialize else "VIEW"
        try:
            self.grown(lambda: self.con.execute(f"CREATE TEMP {kind} {_ident(r.name)} AS {r.sql}"))
        except duckdb.Error as e:
            raise GateError(f"{self.where}: relation {r.name!r} does not run: {_one_line(e)}") from None

    def grown(self, run: Any) -> Any:
        """run(), rerun with twice DuckDB's memory limit while an operator that cannot spill runs
        out of it (DUCKDB_RETRIES times at most)."""
        import duckdb

        for attempt in range(DUCKDB_RETRIES + 1):
            try:
                return run()
            except duckdb.OutOfMemoryException:
                if attempt == DUCKDB_RETRIES:
                    raise
                self.limit *= 2
                self.con.execute(f"SET memory_limit = '{self.limit}MB'")

    def attach(self, inputs, files_of, facts, table_key, view, where, computed, relations) -> None:
        import duckdb

        con = self.con
        for inp, files in zip(inputs, files_of):
            register_input(con, inp, files, table_key if inp is inputs[0] else None)
        for name, table in computed.items():
            con.register(name, table)
        for r in relations:
            self.create(r)
        self.source = f"({view})" if view else _ident(inputs[0].name)
        try:
            self.columns = list(con.sql(f"SELECT * FROM {self.source} AS t LIMIT 0").columns)
        except duckdb.Error as e:
            given = ", ".join(i.name for i in inputs)
            raise GateError(f"{where}: view does not run: {_one_line(e)}; inputs given: {given} "
                            "(pass more with --input NAME=PATH)") from None
        try:
            for f, inp in zip(facts, inputs):
                f["rows"] = con.execute(f"SELECT count(*) FROM {_ident(inp.name)}").fetchall()[0][0]
        except duckdb.Error as e:
            raise GateError(f"{where}: reading the table failed: {_one_line(e)}") from None

    def count(self) -> int:
        return self.con.execute(f"SELECT count(*) FROM {self.source} AS t").fetchall()[0][0]

    def arrow_batches(self, keep: list[str]) -> Iterator[Any]:
        import duckdb
        import pyarrow as pa

        if not keep:
            yield None
            return
        query = f"SELECT {', '.join(map(_ident, keep))} FROM {self.source} AS t"

        def start() -> tuple[Any, list]:   # the view's pipeline breakers run before the first batch
            reader = self.con.sql(query).to_arrow_reader(BATCH_ROWS)
            try:
                return reader, [reader.read_next_batch()]
            except StopIteration:
                return reader, []
        try:
            reader, first = self.grown(start)
            yield from first
            yield from reader
            yield pa.RecordBatch.from_pylist([], schema=reader.schema)   # see ParquetSource
        except duckdb.Error as e:
            raise GateError(f"{self.where}: reading the table failed: {_one_line(e)}") from None

    def close(self) -> None:
        _close(self.con, self.tmp)


def _close(con: Any, tmp: list[str]) -> None:
    import shutil

    if con is not None:
        con.close()
    for d in tmp:
        shutil.rmtree(d, ignore_errors=True)


def to_frame(arrow, rows: int, order: list[str]):
    """Arrow -> pandas with the dtypes GX's vectorised paths need.

    GX 1.24 checks `between` with numpy int64/float64 only (other dtypes go through a Python
    call per row: 0.09 s per 100k), so every integer becomes int64 (float64 when nulls) and
    decimals (DuckDB sums, averages) become float64. Strings stay pandas 3's Arrow-backed str.
    Columns in `order` that were not loaded are all-null placeholders: only their names are read.
    """
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    data = {}
    if arrow is not None:
        for name, col in zip(arrow.column_names, arrow.columns):
            t = col.type
            if pa.types.is_dictionary(t):
                col, t = col.cast(t.value_type), t.value_type
            if pa.types.is_integer(t) and t != pa.int64():
                col = col.cast(pa.int64()) if not pa.types.is_uint64(t) else col.cast(pa.float64())
            elif pa.types.is_decimal(t) or pa.types.is_floating(t) and t != pa.float64():
                col = col.cast(pa.float64())
            elif pa.types.is_large_string(t) or pa.types.is_string_view(t):
                col = col.cast(pa.string())
            data[name] = col
        frame = pa.table(data).to_pandas()
    else:
        frame = pd.DataFrame(index=pd.RangeIndex(rows))
    for name in order:
        if name not in frame.columns:
            frame[name] = np.full(rows, np.nan)
    return frame[order] if order else frame


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
