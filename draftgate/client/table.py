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
"""

from __future__ import annotations

import contextlib
from collections import Counter
from operator import itemgetter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from draftgate.client.journal import latest
from draftgate.client.request import Prompt


def responses_table(prompts: list[Prompt], hashes: dict[str, str], records: list[dict[str, Any]],
                    stop_reason: str | None = None) -> Any:
    import pyarrow as pa

    from draftgate import schema

    chosen = latest(records, hashes)
    rows = []
    for p in prompts:
        rec = chosen.get(p.prompt_id)
        rows.append(_row(p, hashes[p.prompt_id], rec) if rec else _unsent(p, hashes[p.prompt_id], stop_reason))
    return pa.Table.from_pylist(rows, schema=schema.responses())


TEXT_FIELDS = ("reasoning", "reasoning_details", "content", "tool_calls", "logprobs")
# What a failed row shows of its last attempt's answer (a junk 200), when there was one.
SHOWN_FIELDS = ("generation_id", "model", "finish_reason", "native_finish_reason", *TEXT_FIELDS, "usage",
                "token_ids", "prompt_token_ids")


def _row(p: Prompt, rhash: str, rec: dict[str, Any], utf8_known: bool = False) -> dict[str, Any]:
    """`utf8_known`: the line was parsed by a reader that refuses lone surrogates (journal.loads_clean)."""
    if rec["status"] != "ok" and rec.get("failed_attempts"):
        last = rec["failed_attempts"][-1]
        rec = {**rec, **{k: last[k] for k in SHOWN_FIELDS if k in last}}
    if not utf8_known and any(_not_utf8(rec.get(f)) for f in TEXT_FIELDS):
        # Text with a lone surrogate cannot be UTF-8, so it can be neither stored in Parquet nor
        # tokenised exactly. The journal keeps it as received; the row is a failure with a reason.
        rec = {**{k: v for k, v in rec.items() if k not in TEXT_FIELDS}, "status": "failed",
               "failure_reason": "invalid_unicode" if rec["status"] == "ok" else rec.get("failure_reason")}
    usage = rec.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    ok = rec["status"] == "ok"
    wasted = rec.get("wasted_cost_usd")
    return {
        "prompt_id": p.prompt_id, "dataset": p.dataset, "request_hash": rhash,
        "status": rec["status"], "failure_reason": None if ok else rec.get("failure_reason"),
        "generation_id": rec.get("generation_id"), "provider": rec.get("provider"), "model": rec.get("model"),
        "finish_reason": rec.get("finish_reason"), "native_finish_reason": rec.get("native_finish_reason"),
        "reasoning": rec.get("reasoning"), "reasoning_details": rec.get("reasoning_details"),
        "content": rec.get("content"), "tool_calls": rec.get("tool_calls"),
        "billed_prompt_tokens": _int(usage.get("prompt_tokens")),
        "billed_completion_tokens": _int(usage.get("completion_tokens")),
        "billed_reasoning_tokens": _int(details.get("reasoning_tokens")),
        "cost_usd": (rec.get("cost_usd") or 0.0) + (wasted or 0.0) if ok else wasted,
        "wasted_cost_usd": wasted,
        "logprobs": rec.get("logprobs"), "truth_ids": rec.get("token_ids"),
        "prompt_token_ids": rec.get("prompt_token_ids"),
        "attempts": rec.get("attempts"), "latency_s": rec.get("latency_s"),
    }


def _unsent(p: Prompt, rhash: str, stop_reason: str | None) -> dict[str, Any]:
    return {**_NONE, "prompt_id": p.prompt_id, "dataset": p.dataset, "request_hash": rhash, "status": "failed",
            "failure_reason": f"unsent_{stop_reason}" if stop_reason else "unsent", "attempts": 0,
            "cost_usd": 0.0, "wasted_cost_usd": 0.0}


_NONE = dict.fromkeys(("generation_id", "provider", "model", "finish_reason", "native_finish_reason", "reasoning",
                       "reasoning_details", "content", "tool_calls", "billed_prompt_tokens",
                       "billed_completion_tokens", "billed_reasoning_tokens", "logprobs", "truth_ids",
                       "prompt_token_ids", "latency_s"))


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

    def ids(self) -> Iterator[Prompt]:
        """Like calling it, with only prompt_id and dataset read: for the table, whose rows need
        nothing else of a prompt once its request hash is known."""
        import pyarrow.parquet as pq

        n = len(self)
        i = 0
        # No pre-buffering: it keeps what it read, so memory would grow with the file.
        reader = pq.ParquetFile(self.path, pre_buffer=False)
        for b in reader.iter_batches(batch_size=self.batch, columns=["prompt_id", "dataset"]):
            for pid, dataset in zip(b.column(0).to_pylist(), b.column(1).to_pylist()):
                if i >= n:
                    return
                yield Prompt(pid, dataset or "", [], None, 0)
                i += 1

    def __call__(self) -> Iterator[Prompt]:
        import pyarrow.parquet as pq

        from draftgate.client.request import prompt_from_row

        n = len(self)
        i = 0
        for b in pq.ParquetFile(self.path, pre_buffer=False).iter_batches(batch_size=self.batch,
                                                         columns=["prompt_id", "dataset", "messages", "tools"]):
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
                    hashes: bytes = b"", index: Any = None) -> TableStats:
    """`responses_table`'s rows, streamed to `out` (atomic): prompts in order, each prompt's chosen
    journal line read by its byte range (journal.JournalIndex, asked a batch of prompts at a time),
    a batch in memory at a time. `hashes`/`index`: what the run already computed (run.RunResult),
    else they are redone; with `hashes`, a PromptFile's messages are not even read (`ids`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate import schema
    from draftgate.client.journal import JournalIndex, digest64, hash64_array
    from draftgate.io import atomic_path

    index = index if index is not None else JournalIndex.scan(journal_path)
    stats = TableStats()
    fields = schema.responses()
    take = itemgetter(*fields.names)    # every row has every field (_row, _unsent)
    source = prompts.ids if hashes and isinstance(prompts, PromptFile) else prompts

    def flush(w: Any, chunk: list[Prompt], start: int) -> None:
        hs = hashes[32 * start:32 * (start + len(chunk))] if hashes else \
            b"".join(bytes.fromhex(hash_of(p)) for p in chunk)
        at = index.lookup([digest64(p.prompt_id) for p in chunk], hash64_array(hs))
        rows = []
        for j, (p, where) in enumerate(zip(chunk, index.where(at))):
            h = hs[32 * j:32 * j + 32].hex()
            row = _row(p, h, *JournalIndex.read_clean(jf, where)) if where else _unsent(p, h, stop_reason)
            stats.rows += 1
            stats.ok += row["status"] == "ok"
            if row["failure_reason"] is not None:
                stats.failure_reasons[row["failure_reason"]] += 1
            stats.cost_usd += row["cost_usd"] or 0.0
            rows.append(row)
        # Columns, not a dict per row: pyarrow builds them ~2.5x faster.
        columns = zip(*map(take, rows)) if rows else [[] for _ in fields]
        w.write_table(pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(columns, fields)],
                                           schema=fields))

    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, fields) as w, \
            contextlib.ExitStack() as stack:
        jf = stack.enter_context(open(journal_path, "rb")) if index.records else None
        chunk: list[Prompt] = []
        start = 0
        for p in source():
            chunk.append(p)
            if len(chunk) >= batch:
                flush(w, chunk, start)
                start, chunk = start + len(chunk), []
        if chunk or not stats.rows:
            flush(w, chunk, start)
    return stats


def read_prompts(path: str) -> list[Prompt]:
    """prompts.parquet -> Prompt records, in table order."""
    import pyarrow.parquet as pq

    from draftgate.client.request import prompt_from_row

    try:
        table = pq.read_table(path, columns=["prompt_id", "dataset", "messages", "tools"])
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found; run the prompts stage first (dvc repro prompts)") from None
    return [prompt_from_row(row, f"{path}:row {i}") for i, row in enumerate(table.to_pylist())]
