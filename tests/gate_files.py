"""Small files for gate tests, and `draftgate validate` called as the CLI would be."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from draftgate.gates import validate as gates


def write_parquet(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def validate(*argv) -> int:
    return gates.main([str(a) for a in argv])
