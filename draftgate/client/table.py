"""prompts.parquet -> Prompt records; journal lines -> `responses.parquet` (schema `draftgate.schema.responses()`, exactly).

One row per prompt in scope, in prompt-table order: the journal's representative line (last ok,
else last failed, current request hash only), or, for a prompt no request was made for, a failed
row with reason `unsent_<why>` and 0 attempts, so nothing in scope disappears silently.

A failed row shows what its last attempt got back, when that was an answer (a junk 200: leaked
error or content-parts repr in `content`): the table is its quarantine, the reason in
`failure_reason`. `cost_usd` is what the line's attempts cost: the kept answer plus paid failures.
It is an upper bound, not a bill: an attempt whose answer was lost (a timeout, a dropped
connection) may or may not have been billed, and counts at its worst case (a deliberately high
prompt estimate plus max_tokens at generate.price; `worst_case_usd` in the journal,
client/budget.py), so the table's sum can exceed the provider's invoice; it falls short only if
generate.price is below the real price. `wasted_cost_usd` is the part that bought no kept answer
(billed failures and those worst cases).

`redacted`: a secret was cut out of the row's model output (client/redact.py), so it cannot be
rebuilt exactly; reconstruct quarantines it (`secret_in_output`). Wall times (`latency_s`,
`elapsed_s`, `finished_at`) stay in the journal and the metrics: in this DVC output they would
change its bytes on every run and make everything downstream rerun.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from draftgate.client.journal import latest
from draftgate.client.request import Prompt
from draftgate.client.response import MODEL_OUTPUT


def responses_table(prompts: list[Prompt], hashes: dict[str, str], records: list[dict[str, Any]],
                    stop_reason: str | None = None) -> Any:
    import pyarrow as pa

    from draftgate import schema

    chosen = latest(records, hashes)
    rows = []
    for p in prompts:
        rec, h = chosen.get(p.prompt_id), hashes[p.prompt_id]
        row = _row(p.prompt_id, p.dataset, h, rec) if rec else _unsent(p.prompt_id, p.dataset, h, stop_reason)
        rows.append(dict(zip(FIELDS, row)))
    return pa.Table.from_pylist(rows, schema=schema.responses())


# schema.responses()'s columns, in order: rows are tuples of these (tested equal to the schema).
FIELDS = ("prompt_id", "dataset", "request_hash", "status", "failure_reason", "generation_id", "provider",
          "model", "finish_reason", "native_finish_reason", "reasoning", "reasoning_details", "content",
          "tool_calls", "billed_prompt_tokens", "billed_completion_tokens", "billed_reasoning_tokens",
          "cost_usd", "wasted_cost_usd", "logprobs", "truth_ids", "prompt_token_ids", "attempts", "redacted")
STATUS, FAILURE_REASON, COST = FIELDS.index("status"), FIELDS.index("failure_reason"), FIELDS.index("cost_usd")
TEXT_FIELDS = ("reasoning", "reasoning_details", "content", "tool_calls", "logprobs")
# What a failed row shows of its last attempt's answer (a junk 200), when there was one.
SHOWN_FIELDS = ("generation_id", "model", "finish_reason", "native_finish_reason", *TEXT_FIELDS, "usage",
                "token_ids", "prompt_token_ids", "redacted")
_MODEL_OUTPUT = frozenset(MODEL_OUTPUT)


def _row(prompt_id: str, dataset: str, rhash: str, rec: dict[str, Any], utf8_known: bool = False) -> tuple:
    """`utf8_known`: the line was parsed by a reader that refuses lone surrogates (journal.loads_clean)."""
    if rec["status"] != "ok" and rec.get("failed_attempts"):
        last = rec["failed_attempts"][-1]
        rec = {**rec, **{k: last[k] for k in SHOWN_FIELDS if k in last}}
    if not utf8_known and any(_not_utf8(rec.get(f)) for f in TEXT_FIELDS):
        # Text with a lone surrogate cannot be UTF-8, so it can be neither stored in Parquet nor
        # tokenised exactly. The journal keeps it as received; the row is a failure with a reason.
        rec = {**{k: v for k, v in rec.items() if k not in TEXT_FIELDS}, "status": "failed",
               "failure_reason": "invalid_unicode" if rec["status"] == "ok" else rec.get("failure_reason")}
    get = rec.get
    usage = get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    ok = rec["status"] == "ok"
    wasted = get("wasted_cost_usd")
    return (prompt_id, dataset, rhash, rec["status"], None if ok else get("failure_reason"),
            get("generation_id"), get("provider"), get("model"), get("finish_reason"), get("native_finish_reason"),
            get("reasoning"), get("reasoning_details"), get("content"), get("tool_calls"),
            _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")),
            _int(details.get("reasoning_tokens")),
            (get("cost_usd") or 0.0) + (wasted or 0.0) if ok else wasted, wasted,
            get("logprobs"), get("token_ids"), get("prompt_token_ids"), get("attempts"),
            not _MODEL_OUTPUT.isdisjoint(get("redacted") or ()))


def _unsent(prompt_id: str, dataset: str, rhash: str, stop_reason: str | None) -> tuple:
    reason = f"unsent_{stop_reason}" if stop_reason else "unsent"
    return (prompt_id, dataset, rhash, "failed", reason, *_NONE[:12], 0.0, 0.0, None, None, None, 0, False)


_NONE = (None,) * 12   # generation_id .. billed_reasoning_tokens


def _not_utf8(text: Any) -> bool:
    if not isinstance(text, str):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


class PromptFile:
    """prompts.parquet as a prompt source: each call streams its rows afresh, batch by batch, in
    table order, the first `limit` only (run.run_async takes it in place of a list)."""

    def __init__(self, path: str | Path, limit: int | None = None, batch: int = 4096):
        import pyarrow.parquet as pq

        try:
            self.rows = pq.ParquetFile(path).metadata.num_rows
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: not found; run the prompts stage first (dvc repro prompts)") from None
        self.path, self.limit, self.batch = str(path), limit, batch

    def __len__(self) -> int:
        return self.rows if self.limit is None else min(self.rows, self.limit)

    def ids(self, sizes: bool = False) -> Iterator[Prompt]:
        """Like calling it, with only prompt_id and dataset read: for the table, whose rows need
        nothing else of a prompt once its request hash is known. `sizes`: `chars` too (what the
        budget's worst case needs), counted by Arrow without parsing the JSON."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        n = len(self)
        i = 0
        # No pre-buffering: it keeps what it read, so memory would grow with the file.
        reader = pq.ParquetFile(self.path, pre_buffer=False)
        columns = ["prompt_id", "dataset", *(["messages", "tools"] if sizes else [])]
        for b in reader.iter_batches(batch_size=self.batch, columns=columns):
            chars = (pc.add(*(pc.fill_null(pc.utf8_length(b.column(c)), 0) for c in (2, 3))).to_pylist()
                     if sizes else [0] * b.num_rows)
            for pid, dataset, c in zip(b.column(0).to_pylist(), b.column(1).to_pylist(), chars):
                if i >= n:
                    return
                yield Prompt(pid, dataset or "", [], None, c)
                i += 1

    def id_batches(self) -> Iterator[tuple[list[str], list[str]]]:
        """(prompt ids, datasets) a batch at a time, in table order, the first `limit` only."""
        import pyarrow.parquet as pq

        left = len(self)
        reader = pq.ParquetFile(self.path, pre_buffer=False)
        for b in reader.iter_batches(batch_size=self.batch, columns=["prompt_id", "dataset"]):
            if left <= 0:
                return
            b = b.slice(0, left)
            left -= b.num_rows
            yield b.column(0).to_pylist(), [d or "" for d in b.column(1).to_pylist()]

    def rows_at(self, wanted: list[int]) -> dict[int, Prompt]:
        """The prompts at these row numbers, parsed, reading the file batch by batch."""
        import pyarrow.parquet as pq

        from draftgate.client.request import prompt_from_row

        out, start, todo = {}, 0, sorted(i for i in wanted if i < len(self))
        for b in pq.ParquetFile(self.path, pre_buffer=False).iter_batches(
                batch_size=self.batch, columns=["prompt_id", "dataset", "messages", "tools", "thinking"]):
            here = [i for i in todo if start <= i < start + b.num_rows]
            if here:
                for i, row in zip(here, b.take([i - start for i in here]).to_pylist()):
                    out[i] = prompt_from_row(row, f"{self.path}:row {i}")
            start += b.num_rows
            if not todo or start > todo[-1]:
                break
        return out

    def __call__(self) -> Iterator[Prompt]:
        import pyarrow.parquet as pq

        from draftgate.client.request import prompt_from_row

        n = len(self)
        i = 0
        for b in pq.ParquetFile(self.path, pre_buffer=False).iter_batches(batch_size=self.batch,
                                                         columns=["prompt_id", "dataset", "messages", "tools",
                                                                  "thinking"]):
            for row in b.to_pylist():
                if i >= n:
                    return
                yield prompt_from_row(row, f"{self.path}:row {i}")
                i += 1


@dataclass
class TableStats:
    rows: int = 0
    ok: int = 0
    failure_reasons: Counter = field(default_factory=Counter)
    cost_usd: float = 0.0


def write_responses(out: str | Path, prompts: Callable[[], Iterator[Prompt]], hash_of: Callable[[Prompt], str],
                    journal_path: str | Path, stop_reason: str | None = None, batch: int = 4096,
                    hashes: bytes = b"", index: Any = None, keys: bytes = b"") -> TableStats:
    """`responses_table`'s rows, streamed to `out` (atomic): prompts in order, each prompt's chosen
    journal line read by its byte range (journal.JournalIndex, asked a batch of prompts at a time),
    a batch in memory at a time. `hashes`/`index`: what the run already computed (run.RunResult),
    else they are redone; with `hashes`, a PromptFile's messages are not even read (`id_batches`).
    `keys`: digest64 of each prompt id (run.RunResult.key_bytes), else recomputed."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate import schema
    from draftgate.client.journal import JournalIndex, digest64, hash64_array, loads_clean
    from draftgate.io import atomic_path

    index = index if index is not None else JournalIndex.scan(journal_path)
    stats = TableStats()
    fields = schema.responses()
    all_keys = np.frombuffer(keys, dtype=np.uint64) if keys else None

    def batches() -> Iterator[tuple[list[str], list[str], bytes]]:
        """(prompt ids, datasets, their request hashes as 32 bytes each), a batch at a time."""
        if hashes and isinstance(prompts, PromptFile):
            start = 0
            for pids, datasets in prompts.id_batches():
                yield pids, datasets, hashes[32 * start:32 * (start + len(pids))]
                start += len(pids)
            return
        chunk: list[Prompt] = []
        for p in prompts():
            chunk.append(p)
            if len(chunk) >= batch:
                yield _listed(chunk, hash_of, hashes, stats.rows)
                chunk = []
        yield _listed(chunk, hash_of, hashes, stats.rows)

    def flush(w: Any, pids: list[str], datasets: list[str], hs: bytes) -> None:
        start = stats.rows
        ks = all_keys[start:start + len(pids)] if all_keys is not None else [digest64(p) for p in pids]
        offs, lens = index.spans(index.lookup(ks, hash64_array(hs)))
        hexed = hs.hex()
        rows = []
        for j, (pid, ds, off, n) in enumerate(zip(pids, datasets, offs.tolist(), lens.tolist())):
            h = hexed[64 * j:64 * j + 64]
            if off < 0:
                rows.append(_unsent(pid, ds, h, stop_reason))
                continue
            raw = os.pread(fd, n, off)
            rec, clean = loads_clean(raw)
            rows.append(_row(pid, ds, h, rec if rec is not None else json.loads(raw), clean))
        stats.rows += len(rows)
        status, reasons, costs = (list(c) for c in zip(*((r[STATUS], r[FAILURE_REASON], r[COST]) for r in rows))) \
            if rows else ([], [], [])
        stats.ok += status.count("ok")
        stats.failure_reasons.update(r for r in reasons if r is not None)
        stats.cost_usd += sum(c for c in costs if c)
        # Columns, not a dict per row: pyarrow builds them ~2.5x faster.
        columns = zip(*rows) if rows else [[] for _ in fields]
        w.write_table(pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, fields)],
                                           schema=fields))

    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, fields) as w, contextlib.ExitStack() as stack:
        # Each chosen line is one pread: no seek, no buffer. (A memory map reads no faster, and
        # every page it touched would count in the stage's RSS.)
        fd = stack.enter_context(open(journal_path, "rb")).fileno() if index.records else -1
        for pids, datasets, hs in batches():
            if pids or not stats.rows:
                flush(w, pids, datasets, hs)
    return stats


def _listed(chunk: list[Prompt], hash_of: Callable[[Prompt], str], hashes: bytes,
            start: int) -> tuple[list[str], list[str], bytes]:
    hs = hashes[32 * start:32 * (start + len(chunk))] if hashes else \
        b"".join(bytes.fromhex(hash_of(p)) for p in chunk)
    return [p.prompt_id for p in chunk], [p.dataset for p in chunk], hs


def read_prompts(path: str) -> list[Prompt]:
    """prompts.parquet -> Prompt records, in table order."""
    import pyarrow.parquet as pq

    from draftgate.client.request import prompt_from_row

    try:
        # thinking: the row's serving mode, when the table has it (a prompts table from before it has not).
        names = set(pq.read_schema(path).names)
        table = pq.read_table(path, columns=["prompt_id", "dataset", "messages", "tools",
                                             *(["thinking"] if "thinking" in names else [])])
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found; run the prompts stage first (dvc repro prompts)") from None
    return [prompt_from_row(row, f"{path}:row {i}") for i, row in enumerate(table.to_pylist())]
