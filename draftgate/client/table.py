"""prompts.parquet -> Prompt records; journal lines -> `responses.parquet` (schema `draftgate.schema.responses()`, exactly).

One row per prompt in scope, in prompt-table order: the journal's representative line (last ok,
else last failed, current request hash only), or, for a prompt no request was made for, a failed
row with reason `unsent_<why>` and 0 attempts, so nothing in scope disappears silently.

A failed row shows what its last attempt got back, when that was an answer (a junk 200: leaked
error or content-parts repr in `content`): the table is its quarantine, the reason in
`failure_reason`. `cost_usd` is everything the line's attempts were billed (the kept answer plus
paid failures); `wasted_cost_usd` is the part that bought no kept answer.
"""

from __future__ import annotations

import contextlib
from collections import Counter
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


def _row(p: Prompt, rhash: str, rec: dict[str, Any]) -> dict[str, Any]:
    if rec["status"] != "ok" and rec.get("failed_attempts"):
        last = rec["failed_attempts"][-1]
        rec = {**rec, **{k: last[k] for k in SHOWN_FIELDS if k in last}}
    if any(_not_utf8(rec.get(f)) for f in TEXT_FIELDS):
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
    return {"prompt_id": p.prompt_id, "dataset": p.dataset, "request_hash": rhash, "status": "failed",
            "failure_reason": f"unsent_{stop_reason}" if stop_reason else "unsent", "attempts": 0,
            "cost_usd": 0.0, "wasted_cost_usd": 0.0}


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

    def __call__(self) -> Iterator[Prompt]:
        import pyarrow.parquet as pq

        from draftgate.client.request import prompt_from_row

        n = len(self)
        i = 0
        for b in pq.ParquetFile(self.path).iter_batches(batch_size=self.batch,
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
    journal line read by its byte range (journal.JournalIndex), a batch in memory at a time.
    `hashes`/`index`: what the run already computed (run.RunResult), else they are redone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate import schema
    from draftgate.client.journal import JournalIndex
    from draftgate.io import atomic_path

    index = index if index is not None else JournalIndex.scan(journal_path)
    stats = TableStats()
    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, schema.responses()) as w, \
            contextlib.ExitStack() as stack:
        jf = stack.enter_context(open(journal_path, "rb")) if index.records else None
        rows: list[dict[str, Any]] = []
        for i, p in enumerate(prompts()):
            h = hashes[32 * i:32 * i + 32].hex() if hashes else hash_of(p)
            where = index.chosen(p.prompt_id, h)
            row = _row(p, h, JournalIndex.read(jf, where)) if where else _unsent(p, h, stop_reason)
            stats.rows += 1
            stats.ok += row["status"] == "ok"
            if row["failure_reason"] is not None:
                stats.failure_reasons[row["failure_reason"]] += 1
            stats.cost_usd += row["cost_usd"] or 0.0
            rows.append(row)
            if len(rows) >= batch:
                w.write_table(pa.Table.from_pylist(rows, schema=schema.responses()))
                rows = []
        if rows or not stats.rows:
            w.write_table(pa.Table.from_pylist(rows, schema=schema.responses()))
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
