"""Async OpenAI-compatible client: bounded concurrency, retries, fsynced journal, resume, budget.

Public surface: `run` / `run_async` (prompts -> journal), `responses_table` (journal -> table),
`read_prompts`, `Target`, `RunResult`. Modules: http (transport), request (bodies, request_hash),
response (parsing, raw JSON slices, junk outputs), retry (classification, backoff, 429 pause),
journal, redact (secrets out of journaled error bodies), budget, progress, table, estimate
(`draftgate estimate`).
"""

from draftgate.client.run import RunResult, Target, current_hashes, run, run_async, select
from draftgate.client.table import read_prompts, responses_table

__all__ = ["RunResult", "Target", "current_hashes", "read_prompts", "responses_table", "run",
           "run_async", "select"]
