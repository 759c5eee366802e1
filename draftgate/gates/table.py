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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
            con.execute(f"CREATE VIEW {_ident(inp.name)} AS SELECT * FROM read_json({listing}, "
                        "format='unstructured', maximum_object_size=268435456)")
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

@dataclass
class Loaded:
    frame: Any                     # pandas DataFrame given to GX
    rows: int
    columns: list[str]             # every column of the validated table
    loaded: list[str]              # the ones materialised
    inputs: list[dict]             # name, path, rows of each input
    files: list[list[Path]]        # each input's files, for fingerprints()


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
               wanted: set[str] | None = None, all_names: bool = False, where: str = "suite") -> Loaded:
    """The validated table: the first input (or `view` over all inputs), only `wanted` columns.

    `all_names`: every column of the table appears (unread ones as null placeholders), for the
    table-level checks that compare column names.
    """
    files_of = [input_files(inp) for inp in inputs]
    facts = [{"name": inp.name, "path": inp.path} for inp in inputs]
    if view is None and len(inputs) == 1 and files_of[0][0].suffix.lower() == ".parquet":
        columns, arrow, rows = _read_parquet(inputs[0], files_of[0], wanted)
        facts[0]["rows"] = rows
    else:
        columns, arrow, rows = _read_duckdb(inputs, files_of, facts, table_key, view, wanted, where)
    keep = [c for c in columns if wanted is None or c in wanted]
    frame = to_frame(arrow, rows, columns if all_names else keep)
    return Loaded(frame=frame, rows=rows, columns=columns, loaded=keep, inputs=facts, files=files_of)


def _read_parquet(inp: Input, files: list[Path], wanted: set[str] | None):
    """A plain Parquet artifact: pyarrow decodes the projected columns in parallel (one 100k-row
    group: ~0.03 s for a tokens table's 7 scalar columns, DuckDB ~0.04 s)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    try:
        dataset = ds.dataset([str(f) for f in files], format="parquet")
        columns = list(dataset.schema.names)
        keep = [c for c in columns if wanted is None or c in wanted]
        if keep:
            arrow = dataset.to_table(columns=keep)
            return columns, arrow, arrow.num_rows
        return columns, None, dataset.count_rows()
    except (pa.ArrowException, OSError) as e:
        raise GateError(f"input {inp.name!r}: {inp.path}: unreadable as parquet: {_one_line(e)}; "
                        "regenerate the file with the stage that writes it") from None


def _read_duckdb(inputs, files_of, facts, table_key, view, wanted, where):
    """Views, JSONL, JSON documents: every input becomes a DuckDB relation named after it."""
    import duckdb

    con = duckdb.connect()
    for inp, files in zip(inputs, files_of):
        register_input(con, inp, files, table_key if inp is inputs[0] else None)
    source = f"({view})" if view else _ident(inputs[0].name)
    try:
        columns = con.sql(f"SELECT * FROM {source} AS t LIMIT 0").columns
    except duckdb.Error as e:
        given = ", ".join(i.name for i in inputs)
        raise GateError(f"{where}: view does not run: {_one_line(e)}; inputs given: {given} "
                        "(pass more with --input NAME=PATH)") from None
    keep = [c for c in columns if wanted is None or c in wanted]
    try:
        if keep:
            arrow = con.sql(f"SELECT {', '.join(map(_ident, keep))} FROM {source} AS t").to_arrow_table()
            rows = arrow.num_rows
        else:
            arrow, rows = None, con.execute(f"SELECT count(*) FROM {source} AS t").fetchall()[0][0]
        for f, inp in zip(facts, inputs):
            f["rows"] = con.execute(f"SELECT count(*) FROM {_ident(inp.name)}").fetchall()[0][0]
    except duckdb.Error as e:
        raise GateError(f"{where}: reading the table failed: {_one_line(e)}") from None
    return list(columns), arrow, rows


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
