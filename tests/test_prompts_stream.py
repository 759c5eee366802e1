"""Streamed ingestion: first occurrence wins, duplicates counted, the cap keeps the lowest ids, in
bounded memory, and nothing half-written is left behind."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from draftgate import schema
from draftgate.config import PromptsParams
from draftgate.prompts import Prompt, process, split_of, stage_metrics
from draftgate.prompts.stream import ingest_to_files
from test_prompts import USER, corpus, line


def records():
    # Duplicates across files, a reject, a final assistant turn dropped: sorted by (file, line)
    # as raw_files and read_raw give them.
    recs = corpus(300) + corpus(40, "c_again.jsonl")
    recs.append(line({"messages": [{"role": "narrator", "content": "x"}]}, "d.jsonl", 1))
    recs.append(line({"messages": [USER, {"role": "assistant", "content": "7"}]}, "d.jsonl", 2))
    return sorted(recs, key=lambda r: (r.file, r.index))


def first_occurrences():
    firsts: dict[str, Prompt] = {}
    for r in records():
        out = process(r)
        if isinstance(out, Prompt):
            firsts.setdefault(out.prompt_id, out)
    return firsts


@pytest.mark.parametrize("params", [PromptsParams(heldout_fraction=0.3, split_seed=2),
                                    PromptsParams(max_prompts=57), PromptsParams(max_prompts=0)])
def test_the_streamed_tables_keep_first_occurrences_count_duplicates_and_cap_by_lowest_id(tmp_path, params):
    tally = ingest_to_files(iter(records()), params, tmp_path / "out")
    prompts = pq.read_table(tmp_path / "out" / "prompts.parquet")
    rejects = pq.read_table(tmp_path / "out" / "rejects.parquet")
    assert prompts.schema == schema.prompts() and rejects.schema == schema.rejects()
    firsts = first_occurrences()                      # 301 distinct prompts
    kept = sorted(firsts)[:params.max_prompts] if params.max_prompts is not None else sorted(firsts)
    rows = prompts.to_pylist()
    # First-occurrence order, the 40 repeated questions with one duplicate each, the seeded split.
    assert [r["prompt_id"] for r in rows] == [pid for pid in firsts if pid in set(kept)]
    assert all(r["source"] == firsts[r["prompt_id"]].source for r in rows)
    assert all(r["split"] == split_of(r["prompt_id"], params.split_seed, params.heldout_fraction) for r in rows)
    repeated = {f"big.jsonl:{k}" for k in range(1, 41)}     # again in c_again.jsonl
    assert all(r["n_duplicates"] == (r["source"] in repeated) for r in rows)
    assert [(r["source"], r["reason"]) for r in rejects.to_pylist()] == [("d.jsonl:1", "unknown_role")]
    m = stage_metrics(tally, params).to_dict()
    assert (m["rows_in"], m["rows_out"], tally.n_duplicates, tally.n_capped) == \
        (342, len(kept), 40, len(firsts) - len(kept))
    assert m["rows_in"] == m["rows_out"] + m["dropped"]
    answered = process(line({"messages": [USER]})).prompt_id        # d.jsonl:2 without its answer
    assert tally.final_assistant_dropped == (answered in set(kept))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]      # no staging folder left


def test_a_failing_read_leaves_no_output_folder(tmp_path):
    def broken():
        yield from records()[:10]
        raise OSError("raw/x.parquet: cannot be read")
    with pytest.raises(OSError):
        ingest_to_files(broken(), PromptsParams(), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
