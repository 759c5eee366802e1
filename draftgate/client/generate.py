"""The generate stage's work: prompts in scope -> journal (appended, fsynced) -> responses table.

`run(params, GenerateRequest(...), target)` sends what the journal lacks (client.run), rebuilds
responses.parquet from the journal and returns the metrics; stages/generate.py checks the prompts
gate, opens the target (it starts the local server for `backend: local`: the client never imports
the server) and writes them. The journal's line count, size and sha256 go into the metrics: DVC
versions the table; the journal is not a DVC output (journal.py says why).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GenerateRequest:
    prompts: Path                     # prompts.parquet (streamed: twice in the run, once for the table)
    out: Path                         # the folder of responses.parquet
    journal: Path                     # the append-only journal of paid answers


@dataclass(frozen=True)
class GenerateRun:
    metrics: Any                      # draftgate.metrics.StageMetrics
    exit_code: int                    # 0, or 1 when the run stopped on 401 / credits
    summary: str                      # one line for the log


def run(params: Any, request: GenerateRequest, target: Any) -> GenerateRun:
    from draftgate.client import hashcache
    from draftgate.client import run as send
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex, index_path
    from draftgate.client.request import build_body, request_hash
    from draftgate.client.table import PromptFile, write_responses
    from draftgate.config import as_dict
    from draftgate.metrics import StageMetrics

    gp = params.generate
    prompts = PromptFile(request.prompts, gp.limit)
    # Every prompt's request hash, from the last run when nothing that makes one changed.
    key, known = hashcache.checked(prompts, gp, target.identity, request.journal)
    result = send(prompts, gp, target, request.journal, known=known)
    if known is None:
        hashcache.save(hashcache.cache_path(request.journal), key, result.hash_bytes, result.key_bytes)

    def hash_of(p: Any) -> str:
        return request_hash(build_body(p, gp), gp.backend, target.identity)
    # The run's own scan when it appended nothing; else one scan now, kept beside the journal, so
    # the next run reads only what is appended after this one.
    index = result.index or JournalIndex.scan(request.journal, line_cost, cache=index_path(request.journal))
    stats = write_responses(request.out / "responses.parquet", prompts, hash_of, request.journal,
                            result.stop_reason, hashes=result.hash_bytes, index=index, keys=result.key_bytes)
    metrics = StageMetrics("generate", rows_in=len(prompts), params=as_dict(gp))
    metrics.rows_out = stats.ok
    for reason, n in sorted(stats.failure_reasons.items()):
        metrics.drop(reason, n)
    metrics.figures.update(result.figures())
    metrics.figures["table_cost_usd"] = round(stats.cost_usd, 6)
    metrics.figures.update(journal_figures(request.journal, index))
    budget = f" of ${gp.budget_usd:.4f}" if gp.budget_usd else ""
    summary = (f"generate: {len(prompts)} prompts: {metrics.rows_out} ok, {len(prompts) - metrics.rows_out} not "
               f"({result.skipped} already done, {result.sent} sent this run, ${result.spent_usd:.4f} spent this "
               f"run, ${result.journal_spent_usd:.4f}{budget} by the journal in total)"
               + (f"; stopped: {result.stop_reason}" if result.stop_reason else ""))
    return GenerateRun(metrics, result.exit_code, summary)


def journal_figures(path: Path, index: Any = None) -> dict[str, Any]:
    """The journal's identity for the metrics: DVC does not cache it (journal.py explains).
    `index`: a scan of the journal; it hashed the complete lines it read, so a journal of just those
    bytes is not read twice."""
    with contextlib.suppress(FileNotFoundError):
        if index is not None and index.complete_bytes == path.stat().st_size:
            return {"journal_sha256": index.complete_sha256, "journal_lines": index.complete_lines,
                    "journal_bytes": index.complete_bytes}
    h, lines, size = hashlib.sha256(), 0, 0
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            lines += block.count(b"\n")
            size += len(block)
    return {"journal_sha256": h.hexdigest(), "journal_lines": lines, "journal_bytes": size}
