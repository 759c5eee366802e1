"""Reconstruction as the reconstruct stage runs it, on tables built in a test.

The tables are written as responses.parquet and prompts.parquet in a temp folder and streamed
through `reconstruct_files` (the stage's path); tokens.parquet comes back in memory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from draftgate.reconstruct.core import Result, Setup
from draftgate.reconstruct.table import CHUNK, reconstruct_files


def reconstruct_tables(responses: Any, prompts: Any, setup: Setup, on_billing_mismatch: str = "keep", *,
                       chunk: int = CHUNK, billing_params: Any = None) -> tuple[Any, Result, dict]:
    """(tokens table, counts, billing summary), as `reconstruct_files` writes and returns them."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        pq.write_table(responses, d / "responses.parquet")
        pq.write_table(prompts, d / "prompts.parquet")
        result, summary, rows = reconstruct_files(d / "responses.parquet", d / "prompts.parquet", d / "tokens.parquet",
                                                  setup, on_billing_mismatch, billing_params, chunk)
        table = pq.read_table(d / "tokens.parquet")
    assert table.num_rows == rows == responses.num_rows
    return table, result, summary
