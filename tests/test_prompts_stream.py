"""Streamed ingestion makes the same tables and metrics as the in-memory one, in bounded memory."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from draftgate.config import PromptsParams
from draftgate.prompts import ingest, prompts_table, rejects_table, stage_metrics
from draftgate.prompts_stream import ingest_to_files
from test_prompts import USER, corpus, line


def records():
    # Duplicates across files, a reject, a blank line, a final assistant turn dropped: sorted by
    # (file, line) as raw_files and read_raw give them.
    recs = corpus(300) + corpus(40, "c_again.jsonl")
    recs.append(line({"messages": [{"role": "narrator", "content": "x"}]}, "d.jsonl", 1))
    recs.append(line({"messages": [USER, {"role": "assistant", "content": "7"}]}, "d.jsonl", 2))
    return sorted(recs, key=lambda r: (r.file, r.index))


@pytest.mark.parametrize("params", [PromptsParams(heldout_fraction=0.3, split_seed=2),
                                    PromptsParams(max_prompts=57), PromptsParams(max_prompts=0)])
def test_the_streamed_tables_and_metrics_equal_the_in_memory_ones(tmp_path, params):
    tally = ingest_to_files(iter(records()), params, tmp_path / "out")
    whole = ingest(records(), params)
    assert pq.read_table(tmp_path / "out" / "prompts.parquet").equals(prompts_table(whole))
    assert pq.read_table(tmp_path / "out" / "rejects.parquet").equals(rejects_table(whole))
    assert stage_metrics(tally, params).to_dict() == stage_metrics(whole, params).to_dict()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]      # no staging folder left


def test_a_failing_read_leaves_no_output_folder(tmp_path):
    def broken():
        yield from records()[:10]
        raise OSError("raw/x.parquet: cannot be read")
    with pytest.raises(OSError):
        ingest_to_files(broken(), PromptsParams(), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
