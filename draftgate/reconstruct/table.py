"""Tables in, tables out: responses + prompts -> tokens and the mismatch report, in bounded memory.

Rows go through `core.reconstruct` in chunks: ids live as Python lists only for one chunk, each
chunk's Arrow table goes straight to a part file (Arrow IPC), and only a few scalar facts per row
are kept (numpy) for billing, which is settled once over the whole table (settle.py: a convention
is a property of the provider) and written in a second streaming pass over the part file into
tokens.parquet. Prompts are read in step with the responses when the responses follow the
prompts' order, as the generate stage writes them; otherwise they are looked up in memory. Prompt
and completion ids are joined into `input_ids` in numpy, not as a Python list per row.

With more than one usable CPU and more than one chunk, the chunks are reconstructed in forked
worker processes (parallel.py) while the parent reads, looks up prompts and writes; their
results are taken in chunk order, so the bytes written are the serial path's (`workers=1`).
20,000 bench rows on 2 quiet cores: 4.3-4.6 s serial (its encode on 2 threads), 2.6-2.9 s with
2 workers (1.6x), ~0.7 s of it in the parent (the final Parquet write ~0.35 s).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from draftgate.config import BillingParams
from draftgate.reconstruct import parallel
from draftgate.reconstruct.core import EXAMPLES, PROMPT_IDS, Result, Setup, reconstruct
from draftgate.reconstruct.logprobs import BytesIndex
from draftgate.reconstruct.settle import BillingFacts, ChunkFacts, chunk_facts, settle, with_settled

# Rows per core.reconstruct call. Small enough that a chunk's id lists stay in cache and the
# memory they free is reused by the next chunk (4096 rows cost ~15% more in page faults).
CHUNK = 1024
MATCHES = ("exact", "bpe_only", "semantic", "unknown")
PROMPT_COLUMNS = ["prompt_id", "dataset", "messages", "tools", "split", "thinking"]



def reconstruct_files(responses_path: Path, prompts_path: Path, out_path: Path, setup: Setup,
                      on_billing_mismatch: str = "keep", billing_params: Any = None,
                      chunk: int = CHUNK, workers: int | None = None) -> tuple[Result, dict, int]:
    """Stream responses.parquet (+ prompts.parquet) into tokens.parquet; returns (counts,
    billing summary, rows). The output appears whole or not at all (temp file + rename).
    `workers`: processes reconstructing chunks (None: parallel.workers, one per usable CPU;
    1: the serial path, in this process); the output is the same either way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate import schema
    from draftgate.io import atomic_path

    with _collector_paused():
        source = pq.ParquetFile(responses_path, pre_buffer=False)   # pre-buffering holds what it read (~170 B a row)
        if workers is None:
            workers = parallel.workers(source.metadata.num_rows, chunk)
        first = _FirstPass(setup, PromptsInStep(prompts_path), _LazyIndex(setup))
        part = Path(out_path).with_name(f".{Path(out_path).name}.part")
        part.parent.mkdir(parents=True, exist_ok=True)
        try:
            # The part file is read once, right after: Arrow IPC, uncompressed (writing and
            # reading it back cost ~0.07 s for 20,000 bench rows, raw Parquet ~0.45 s).
            with pa.OSFile(str(part), "wb") as f, pa.ipc.new_stream(f, schema.tokens()) as w:
                for t in first.run(source.iter_batches(batch_size=chunk), workers):
                    w.write_table(t)
            settled, summary = settle(first.facts, billing_params or BillingParams(), on_billing_mismatch,
                                      first.total)
            with atomic_path(out_path) as tmp, pq.ParquetWriter(tmp, schema.tokens()) as w, \
                    pa.memory_map(str(part)) as f:
                offset = 0
                # Row groups of 8 chunks, as the Parquet writer is given them.
                for t in _regrouped(pa.ipc.open_stream(f), 8 * chunk):
                    t = with_settled(t, settled, offset, first.total)
                    w.write_table(t)
                    offset += t.num_rows
        finally:
            part.unlink(missing_ok=True)
        return first.total, summary, offset


def _regrouped(batches: Iterable[Any], size: int) -> Iterator[Any]:
    # Tables of `size` rows (the last: the rest) from record batches of any sizes, one contiguous
    # chunk per column.
    import pyarrow as pa

    held, n = [], 0
    for b in batches:
        while b.num_rows:
            take = min(size - n, b.num_rows)
            held.append(b.slice(0, take))
            n, b = n + take, b.slice(take)
            if n == size:
                yield pa.Table.from_batches(held).combine_chunks()
                held, n = [], 0
    if held:
        yield pa.Table.from_batches(held).combine_chunks()


class PromptsInStep:
    """Prompt rows for each chunk of responses, read from prompts.parquet in step with them.

    The generate stage writes one response per prompt in prompt-table order, so one forward pass
    over prompts.parquet serves every chunk, holding only the rows from the chunk's earliest prompt
    on (one read-ahead batch at most). Nothing is read up front. A prompt not found ahead (responses
    in another order, or a prompt that is not there) switches to all prompts in memory, once.
    """

    def __init__(self, prompts_path: Path, responses: Any = None):
        import pyarrow.parquet as pq

        self._file = pq.ParquetFile(prompts_path, pre_buffer=False)   # see reconstruct_files
        self._batches = self._file.iter_batches(batch_size=4096, columns=PROMPT_COLUMNS)
        self._rows: dict[str, dict] = {}
        self._pos: dict[str, int] = {}       # row number in prompts.parquet of each held row
        self._read = 0
        self._all: dict[str, dict] | None = None
        self.in_step = True

    def __call__(self, wanted: list[str]) -> dict[str, dict]:
        if self._all is not None:
            return self._all
        missing = {w for w in wanted if w not in self._rows}
        while missing:
            batch = next(self._batches, None)
            if batch is None:
                # Not ahead: the responses are not in prompt order (or a prompt is absent).
                self.in_step = False
                self._rows, self._pos = {}, {}
                self._all = {p["prompt_id"]: p for p in self._file.read(columns=PROMPT_COLUMNS).to_pylist()}
                return self._all
            for p in batch.to_pylist():
                self._rows[p["prompt_id"]] = p
                self._pos[p["prompt_id"]] = self._read
                self._read += 1
                missing.discard(p["prompt_id"])
        # Forget what came before this chunk's earliest prompt: later chunks need later prompts.
        start = min(self._pos[w] for w in wanted)
        for pid in [pid for pid, k in self._pos.items() if k < start]:
            del self._rows[pid], self._pos[pid]
        return self._rows


class _FirstPass:
    """Reconstruct chunk after chunk, yielding each chunk's table; keep the counts and the facts
    billing is settled on afterwards (settle.py)."""

    def __init__(self, setup: Setup, lookup: Callable[[list[str]], dict], index: Any):
        self.setup, self.lookup, self.index = setup, lookup, index
        self.total = Result([])
        self.facts = BillingFacts()

    def run(self, batches: Iterable[Any], workers: int = 1) -> Iterator[Any]:
        if workers < 2:
            done: Iterable[tuple[Any, Result, ChunkFacts]] = (
                reconstruct_chunk(rows, self.lookup([r["prompt_id"] for r in rows]), self.setup, self.index)
                for rows in (batch.to_pylist() for batch in batches))
            yield from self._taken(done)
            return
        with parallel.Pool(workers, (self.setup, self.index)) as pool:
            done = ((parallel.from_ipc(t), res, facts)
                    for t, res, facts in pool.imap(_chunk_in_worker, self._tasks(batches)))
            yield from self._taken(done)

    def _taken(self, done: Iterable[tuple[Any, Result, ChunkFacts]]) -> Iterator[Any]:
        # In chunk order: codes, counts and examples come out as the serial path makes them.
        for t, res, facts in done:
            self.facts.add(facts)
            _merge(self.total, res)
            yield t

    def _tasks(self, batches: Iterable[Any]) -> Iterator[tuple[bytes, dict]]:
        # A chunk's responses as IPC bytes (the worker makes the rows) and the prompt rows it needs.
        for batch in batches:
            wanted = dict.fromkeys(batch.column("prompt_id").to_pylist())
            held = self.lookup(list(wanted))
            yield parallel.to_ipc(batch), {p: held[p] for p in wanted if p in held}


def reconstruct_chunk(rows: list[dict], prompts: dict, setup: Setup, index: Any) -> tuple[Any, Result, ChunkFacts]:
    """One chunk: its tokens table, its counts and examples (no rows), its billing facts."""
    res = reconstruct(rows, prompts, setup, index, joined=False)
    t, facts = to_arrow(res.rows), chunk_facts(res.rows)
    res.rows = []
    return t, res, facts


def _chunk_in_worker(state: tuple[Setup, Any], responses: bytes, prompts: dict) -> tuple[bytes, Result, ChunkFacts]:
    t, res, facts = reconstruct_chunk(parallel.from_ipc(responses).to_pylist(), prompts, *state)
    return parallel.to_ipc(t), res, facts


class _LazyIndex:
    """The logprob-bytes index, built on first use (~1 s for 151k ids): only rows with logprobs
    and no truth ids need it. Worker processes inherit it unbuilt and build their own."""

    def __init__(self, setup: Setup):
        self._setup, self._index = setup, None

    def lookup(self, logprobs: Any) -> Any:
        if self._index is None:
            self._index = BytesIndex(self._setup.tok.token_bytes, self._setup.tok.vocab_size)
        return self._index.lookup(logprobs)


def to_arrow(rows: list[dict]) -> Any:
    """Rows -> a tokens table. Id lists go through numpy (~4x faster than pyarrow's per-element
    conversion of Python lists: 0.15 s vs 0.55 s for 4,000 rows of ~1,500 ids). Rows come
    joined (`input_ids`, `loss_mask` lists) or, from reconstruct(joined=False), split: the
    prompt's ids under PROMPT_IDS, joined here with the completion's without a list per row."""
    import pyarrow as pa

    from draftgate import schema

    sch = schema.tokens()
    split = any(PROMPT_IDS in r for r in rows)
    lists = _split_ids(rows) if split else _joined_ids(rows)
    # The other columns: every row's values in one C-level pass, transposed (3x quicker than a
    # comprehension per column).
    names = [f.name for f in sch if f.name not in lists]
    values_by_column = zip(*map(itemgetter(*names), rows)) if rows else ([] for _ in names)
    lists.update((name, pa.array(v, type=sch.field(name).type)) for name, v in zip(names, values_by_column))
    return pa.Table.from_arrays([lists[f.name] for f in sch], schema=sch)


def _joined_ids(rows: list[dict]) -> dict[str, Any]:
    # A completion is the tail of its row's input_ids: where every row shows it (a slice
    # compare, ~5x cheaper than converting the ids again), the completion column is cut from
    # the converted input ids.
    import numpy as np
    import pyarrow as pa

    inputs = [r["input_ids"] for r in rows]
    completions = [r["completion_ids"] for r in rows]
    starts = [r["prompt_len"] or 0 for r in rows]
    lens, values = _flat(inputs)
    offsets = _offsets(lens)
    missing = pa.array([x is None for x in inputs], type=pa.bool_())
    prompt = np.array(starts, dtype=np.int64)
    in_completion = _in_completion(offsets, prompt)
    lists = {"input_ids": _list(offsets, values, missing),
             "loss_mask": _list(offsets, in_completion.astype(np.int8), missing)}
    if all(c is None if i is None else c is not None and i[s:] == c
           for i, c, s in zip(inputs, completions, starts)):
        tail = np.maximum(lens - prompt, 0)
        lists["completion_ids"] = _list(_offsets(tail), values[in_completion], missing)
    else:
        lens, values = _flat(completions)
        lists["completion_ids"] = _list(_offsets(lens), values,
                                        pa.array([x is None for x in completions], type=pa.bool_()))
    return lists


def _split_ids(rows: list[dict]) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa

    prompts = [r.get(PROMPT_IDS) for r in rows]
    completions = [r["completion_ids"] for r in rows]
    bad = [r["prompt_id"] for r, p, c in zip(rows, prompts, completions)
           if r["input_ids"] is not None or (p is None) != (c is None)]
    if bad:
        raise ValueError(f"to_arrow: rows {bad[:3]} are neither joined nor split; a split row has "
                         f"{PROMPT_IDS} and completion_ids and no input_ids, a quarantined row none")
    plens, pvalues = _flat(prompts)
    clens, cvalues = _flat(completions)
    offsets = _offsets(plens + clens)
    in_completion = _in_completion(offsets, plens)
    values = np.empty(len(in_completion), dtype=np.int32)
    values[in_completion] = cvalues
    values[~in_completion] = pvalues
    missing = pa.array([c is None for c in completions], type=pa.bool_())
    return {"input_ids": _list(offsets, values, missing),
            "loss_mask": _list(offsets, in_completion.astype(np.int8), missing),
            "completion_ids": _list(_offsets(clens), cvalues, missing)}


def _in_completion(offsets: Any, prompt: Any) -> Any:
    # Per id of the flat input ids: at or past its row's prompt length (the loss mask).
    import numpy as np

    n = len(offsets) - 1
    row = np.repeat(np.arange(n), np.diff(offsets))
    return np.arange(int(offsets[-1])) - offsets[:-1][row] >= prompt[row]


def _flat(lists: list) -> tuple[Any, Any]:
    # Lengths (a null list has none) and every id of every list, in order, as int32.
    import numpy as np

    lens = np.fromiter((0 if x is None else len(x) for x in lists), dtype=np.int64, count=len(lists))
    values = np.fromiter(chain.from_iterable(x for x in lists if x is not None), dtype=np.int32,
                         count=int(lens.sum()))
    return lens, values


def _offsets(lens: Any) -> Any:
    import numpy as np

    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    return offsets


def _list(offsets: Any, values: Any, missing: Any) -> Any:
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), mask=missing)


REPORT_COLUMNS = ["dataset", "match", "quarantine_reason", "billing_residual", "prompt_billing_residual"]


def mismatch_report(tokens: Any, billing_summary: dict) -> dict:
    """Per dataset: rows, match classes, mismatch rate of the text method, billing agreement.
    `tokens`: a table, or an iterable of tables / record batches (the file read batch by batch:
    memory does not grow with the rows). Counted by Arrow aggregations, not a Python object per
    cell (a million rows cost ~nothing)."""
    per: dict[str, dict[str, int]] = {}
    for part in ([tokens] if hasattr(tokens, "num_rows") else tokens):
        for ds, counts in _report_counts(part).items():
            into = per.setdefault(ds, dict.fromkeys(counts, 0))
            for n, v in counts.items():
                into[n] += v
    return _report(per, billing_summary)


def _report_counts(tokens: Any) -> dict[str, dict[str, int]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    kept = pc.is_null(tokens.column("quarantine_reason"))
    match = tokens.column("match")
    res, pres = tokens.column("billing_residual"), tokens.column("prompt_billing_residual")

    def flag(x: Any) -> Any:
        return pc.cast(pc.fill_null(x, False), pa.int64())
    t = pa.table({
        "dataset": pc.fill_null(tokens.column("dataset"), "unknown"), "rows": pa.repeat(1, tokens.num_rows),
        "kept": flag(kept), **{m: flag(pc.equal(match, m)) for m in MATCHES},
        "not_reconstructed": flag(pc.is_null(match)),
        "billed": flag(pc.and_(kept, pc.is_valid(res))), "billing_agree": flag(pc.and_(kept, pc.equal(res, 0))),
        "prompt_billed": flag(pc.and_(kept, pc.is_valid(pres))),
        "prompt_billing_agree": flag(pc.and_(kept, pc.equal(pres, 0))),
    })
    names = [n for n in t.column_names if n != "dataset"]
    grouped = t.group_by("dataset").aggregate([(n, "sum") for n in names]).to_pylist()
    return {g["dataset"]: {n: g[f"{n}_sum"] for n in names} for g in grouped}


def _report(per: dict[str, dict[str, int]], billing_summary: dict) -> dict:
    if per:
        names = list(next(iter(per.values())))
        per["all"] = {n: sum(c[n] for c in per.values()) for n in names}
    out = {}
    for ds, c in sorted(per.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        known = c["exact"] + c["bpe_only"] + c["semantic"]
        out[ds] = {
            "rows": c["rows"], "kept": c["kept"], **{m: c[m] for m in MATCHES},
            "not_reconstructed": c["not_reconstructed"],
            # Of the rows whose real ids are known: how often re-encoding the text got them wrong.
            "mismatch_rate": round((known - c["exact"]) / known, 6) if known else None,
            "billing_row_agreement": round(c["billing_agree"] / c["billed"], 6) if c["billed"] else None,
            "prompt_billing_row_agreement": (round(c["prompt_billing_agree"] / c["prompt_billed"], 6)
                                             if c["prompt_billed"] else None),
        }
    return {"datasets": out, "billing": billing_summary}


def plot_rows(report: dict) -> list[dict]:
    return [{"dataset": ds, **{m: v[m] for m in MATCHES}, "mismatch_rate": v["mismatch_rate"]}
            for ds, v in report["datasets"].items()]


@contextmanager
def _collector_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _merge(total: Result, part: Result) -> None:
    for k, c in part.counts.items():
        total.counts[k].update(c)
    for k, ex in part.examples.items():
        total.examples[k].extend(ex[:max(0, EXAMPLES - len(total.examples[k]))])
