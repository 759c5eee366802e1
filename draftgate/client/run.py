"""The orchestrator: prompts -> requests in flight -> journal lines, with retries, budget and resume.

`concurrency` workers each take the next prompt and run its attempts (backoff holds the worker's
slot, so in-flight plus waiting never exceeds `concurrency`). Before every attempt, a first try
or a retry, the budget is checked and the attempt's worst case reserved, in memory and in the
journal (a reservation line, fsynced before the request is sent: journal.py, "Write-ahead
budget"). A retry reserves only what the prompt's reservations do not already cover: its worst
case less what the earlier attempts left unspent (all of it after a free 429, none after a lost
answer), so a retry after a free error needs no new reservation. The finished line (fsynced)
settles the prompt's reservations with what its attempts cost; only then are budget, stats and
progress updated. Until then the prompt holds all it reserved, in memory as on disk, so a
`kill -9` at any instant leaves a journal whose total (settled + unsettled at worst case) is
within the budget.

Secrets (redact.py): the key and any configured secret are cut out of every answer where it
arrives (body, headers, error details), before anything is journaled, printed or counted.

Every failed attempt is kept in its prompt's line (`failed_attempts`): cause, HTTP status, the
provider that failed (`error.metadata.provider_name` for OpenRouter errors), the error metadata
(secrets redacted), billed usage and cost, and for a 200 that was junk (a leaked error or content
parts in `content`), the completion as received. A billed failure counts as wasted spend; so
does a lost answer (timeout, dropped connection, unreadable 2xx), at its worst case (budget.py).

The budget covers the whole journal: the run starts from what earlier runs' lines cost (their
unsettled reservations at worst case), prints spent / left before sending, and stops scheduling
when the budget cannot cover the next request even with nothing else in progress. A retry the
budget cannot cover ends its prompt as failed (`budget`, kind `stopped`: retried by a rerun) and
stops the run the same way. It also stops when an answer says the whole run is doomed (401,
credits 402, budget 403); in-flight requests then finish without further retries. Prompts never
sent are not journaled (no request happened); the table lists them as failed with reason
`unsent_<stop reason>`.
"""

from __future__ import annotations

import asyncio
import gc
import os
from array import array
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from draftgate.client.budget import Budget, budget_problem, cost_of, line_cost, worst_case
from draftgate.client.http import ChatClient
from draftgate.client.journal import Journal, JournalIndex, digest64, hash64_array, index_path
from draftgate.client.progress import Progress
from draftgate.client.request import Prompt, build_body, encode_body, request_hash
from draftgate.client.redact import redact, secret_header, secrets_of
from draftgate.client.response import MODEL_OUTPUT, BadBody, Completion, ErrorInfo, error_info, parse_completion
from draftgate.client.retry import PauseGate, Policy, Verdict, classify_exception, classify_status
from draftgate.config import GenerateParams


@dataclass(frozen=True)
class Target:
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    headers: dict[str, str] = field(default_factory=dict)
    # What answers besides the request body (a local server's weights/tokenizer fingerprints);
    # part of every request hash. Empty for remote APIs: the body's model and routing name them.
    identity: dict[str, str] = field(default_factory=dict)
    # Secrets besides the key and credential headers, never to be written (the value of
    # generate.api_key_env even when nothing sends it: target.env_secrets).
    extra_secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Everything redact.py keeps out of what the client writes."""
        return secrets_of([self.api_key, *self.extra_secrets,
                           *(v for k, v in self.headers.items() if secret_header(k))])


@dataclass
class RunResult:
    total: int = 0                 # prompts in scope (after `limit`)
    skipped: int = 0               # already done in the journal (resume)
    sent: int = 0                  # prompts whose requests were started this run
    attempts: int = 0              # HTTP requests made (first tries and retries)
    ok: int = 0
    failed: int = 0
    unsent: int = 0
    stop_reason: str | None = None
    stop_detail: str = ""
    budget_usd: float = 0.0
    spent_before_usd: float = 0.0  # what the journal's earlier lines cost (every earlier run)
    # Of it: reservations no finished line settled (a killed run's requests), at their worst case.
    unsettled_before: int = 0
    unsettled_before_usd: float = 0.0
    reservations: int = 0          # reservation lines this run wrote (one per paid attempt)
    refused_retries: int = 0       # retries the budget could not cover (their prompt failed: budget)
    redacted_answers: int = 0      # kept answers whose model output held a secret (quarantined downstream)
    journal_redacted_lines: int = 0   # lines the journal writer had to redact (a field the client missed)
    retries: Counter = field(default_factory=Counter)     # cause -> retried attempts
    failures: Counter = field(default_factory=Counter)    # final cause -> prompts
    providers: Counter = field(default_factory=Counter)
    finish_reasons: Counter = field(default_factory=Counter)
    spent_usd: float = 0.0         # this run
    wasted_usd: float = 0.0        # this run's attempts that bought no kept answer: billed or lost
    wasted_worst_case_usd: float = 0.0   # the part of it that is lost answers at their worst case
    paid_failed_attempts: int = 0  # failed attempts that were billed (junk 200s, errors with usage)
    lost_attempts: int = 0         # failed attempts whose bill was never seen (timeouts, resets)
    failed_attempts_by_provider: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    pauses_429: int = 0
    journal_torn_tail: bool = False
    journal_bad_lines: int = 0
    journal_commits: int = 0
    hashes: dict[str, str] = field(default_factory=dict, repr=False)
    # Streamed runs: every prompt's request hash (32 bytes each, prompt order), and the journal
    # index when the run appended nothing (the table reuses both instead of redoing them).
    hash_bytes: bytes = field(default=b"", repr=False)
    key_bytes: bytes = field(default=b"", repr=False)   # digest64 of each prompt id (uint64, prompt order)
    index: Any = field(default=None, repr=False)

    @property
    def journal_spent_usd(self) -> float:
        return self.spent_before_usd + self.spent_usd

    @property
    def exit_code(self) -> int:
        return 0 if self.stop_reason in (None, "budget") else 1

    def figures(self) -> dict[str, Any]:
        dt = max(self.elapsed_s, 1e-9)
        return {
            "prompts_in_scope": self.total, "skipped_done": self.skipped, "sent": self.sent,
            "ok": self.ok, "failed": self.failed, "unsent": self.unsent,
            "stop_reason": self.stop_reason, "stop_detail": self.stop_detail,
            "spent_usd": round(self.spent_usd, 6), "wasted_usd": round(self.wasted_usd, 6),
            "wasted_worst_case_usd": round(self.wasted_worst_case_usd, 6),
            "budget_usd": self.budget_usd, "journal_spent_usd": round(self.journal_spent_usd, 6),
            "journal_spent_before_usd": round(self.spent_before_usd, 6),
            "journal_unsettled_before": self.unsettled_before,
            "journal_unsettled_before_usd": round(self.unsettled_before_usd, 6),
            "reservations": self.reservations, "refused_retries": self.refused_retries,
            "redacted_answers": self.redacted_answers, "journal_redacted_lines": self.journal_redacted_lines,
            "paid_failed_attempts": self.paid_failed_attempts, "lost_attempts": self.lost_attempts,
            "failed_attempts_by_provider": dict(sorted(self.failed_attempts_by_provider.items())),
            "providers": dict(sorted(self.providers.items())),
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
            # Always reported, even at 0: "0 truncated" must be a measurement, not a default.
            "truncated_length": self.finish_reasons.get("length", 0),
            "retries_by_cause": dict(sorted(self.retries.items())),
            "failures_by_reason": dict(sorted(self.failures.items())),
            "billed_prompt_tokens": self.prompt_tokens, "billed_completion_tokens": self.completion_tokens,
            "elapsed_s": round(self.elapsed_s, 3),
            "http_requests": self.attempts,
            "requests_per_s": round(self.sent / dt, 2),   # prompts finished per second
            "http_requests_per_s": round(self.attempts / dt, 2),
            "completion_tokens_per_s": round(self.completion_tokens / dt, 1),
            "pauses_429": self.pauses_429,
            "journal_torn_tail": self.journal_torn_tail, "journal_bad_lines": self.journal_bad_lines,
            "journal_commits": self.journal_commits,
        }


def select(prompts: list[Prompt], limit: int | None) -> list[Prompt]:
    """The prompts in scope: the first `limit` in table order (deterministic)."""
    return prompts if limit is None else prompts[:limit]


def current_hashes(prompts: list[Prompt], params: GenerateParams,
                   identity: dict[str, str] | None = None) -> dict[str, str]:
    return {p.prompt_id: request_hash(build_body(p, params), params.backend, identity) for p in prompts}


def run(prompts: list[Prompt], params: GenerateParams, target: Target, journal_path: str | Path,
        policy: Policy | None = None, progress: bool = True, seed: int = 0,
        known: tuple[bytes, bytes] | None = None) -> RunResult:
    return asyncio.run(run_async(prompts, params, target, journal_path, policy, progress, seed, known))


def budget_line(params: GenerateParams, spent: float, n_todo: int, worst: float,
                unsettled: tuple[int, float] = (0, 0.0)) -> str:
    """Printed before anything is sent: what the journal spent, what is left, what is at stake."""
    head = f"generate: {n_todo} prompts to send, up to ${worst:.4f} if each is answered once"
    if params.budget_usd <= 0:
        return f"{head}; no budget (free backend); the journal holds ${spent:.4f} of spend"
    line = (f"{head}; budget ${params.budget_usd:.4f} for the whole journal: ${spent:.4f} spent by earlier "
            f"runs, ${max(params.budget_usd - spent, 0.0):.4f} left")
    if unsettled[0]:
        line += (f" (${unsettled[1]:.4f} of the spend is {unsettled[0]} requests a killed run sent with no "
                 "answer journaled: they may have been billed, so they count at their worst case)")
    return line


PromptSource = Callable[[], Iterator[Prompt]]


async def run_async(prompts: list[Prompt] | PromptSource, params: GenerateParams, target: Target,
                    journal_path: str | Path, policy: Policy | None = None, progress: bool = True,
                    seed: int = 0, known: tuple[bytes, bytes] | None = None) -> RunResult:
    """`prompts`: a list (in memory; `result.hashes` is filled), or a source that yields them
    afresh on each call (table.PromptFile: streamed from prompts.parquet, `limit` applied there;
    nothing per prompt is kept, so memory does not grow with the prompts). `known`: with a
    PromptFile, every prompt's request hash (32 bytes each) and prompt id digest (8), already
    checked (hashcache.py): the first pass then asks the journal about all of them at once and
    reads prompt sizes only when something is to be sent."""
    problem = budget_problem(params)
    if problem:
        raise ValueError(problem)
    if callable(prompts):
        source, hashes = prompts, None
    else:
        listed = select(prompts, params.limit)
        source, hashes = (lambda: iter(listed)), current_hashes(listed, params, target.identity)

    def hash_of(p: Prompt) -> str:
        return hashes[p.prompt_id] if hashes is not None else request_hash(build_body(p, params), params.backend,
                                                                           target.identity)
    result = RunResult(hashes=hashes or {}, budget_usd=params.budget_usd)
    index = JournalIndex.scan(journal_path, line_cost, cache=index_path(journal_path))
    result.spent_before_usd = index.spent_usd
    result.unsettled_before, result.unsettled_before_usd = len(index.unsettled), index.unsettled_usd
    result.journal_torn_tail, result.journal_bad_lines = index.torn_tail, len(index.bad_lines)
    if index.torn_tail or index.bad_lines:
        print(f"generate: {journal_path}: ignoring {int(index.torn_tail)} torn last line and "
              f"{len(index.bad_lines)} unreadable lines (a crash mid-write); those prompts are redone",
              file=sys.stderr)
    # A first pass counts what is to do and its worst case; the second sends it. Both stream. The
    # request hashes are kept as 32 bytes a prompt, in prompt order, for the send and table passes,
    # the prompt ids' digests as 8, and whether each prompt is done as 1 byte.
    if known is not None:
        hashed, keys, done, n_todo, worst = _known_pass(known, prompts, index, params)
        result.total = len(done)
    else:
        hashed, keys, done, n_todo, worst = _hashing_pass(source(), hash_of, index, params, result)
    result.skipped = result.total - n_todo
    result.hash_bytes, result.key_bytes = hashed, keys
    if not n_todo:
        result.index = index      # nothing appended: the table can use the same index
        return result
    print(budget_line(params, result.spent_before_usd, n_todo, worst,
                      (result.unsettled_before, result.unsettled_before_usd)), file=sys.stderr)
    if policy is None:
        policy = Policy(params.retry_base_s, params.retry_max_s, params.retry_after_cap_s)
    runner = _Runner(params, target, policy, result, seed,
                     Progress(n_todo) if progress else None)
    todo = ((p, hashed[32 * i:32 * i + 32].hex()) for i, p in enumerate(source()) if not done[i])
    async with Journal(journal_path, target.secrets) as journal:
        try:
            await runner.run(todo, n_todo, worst, journal)
        finally:
            result.journal_commits, result.journal_redacted_lines = journal.commits, journal.redacted_lines
    if result.journal_redacted_lines:
        print(f"generate: {journal_path}: {result.journal_redacted_lines} lines still held a secret when written "
              "and were redacted by the journal writer (client/redact.py)", file=sys.stderr)
    return result


def _hashing_pass(prompts: Iterator[Prompt], hash_of: Callable[[Prompt], str], index: JournalIndex,
                  params: GenerateParams, result: RunResult) -> tuple[bytes, bytes, bytes, int, float]:
    """Hash each prompt and ask the journal about a batch at a time:
    (hashes, id digests, done flags, prompts to send, their worst-case cost)."""
    hashed, keys, done = bytearray(), array("Q"), bytearray()
    n_todo, worst = 0, 0.0
    batch: list[Prompt] = []

    def settle() -> None:
        nonlocal n_todo, worst
        first = len(keys)
        keys.extend(digest64(p.prompt_id) for p in batch)
        flags = index.is_done(index.lookup(keys[first:], hash64_array(bytes(hashed[32 * first:]))))
        done.extend(flags.tobytes())
        for p, d in zip(batch, flags.tolist()):
            if not d:
                n_todo += 1
                worst += worst_case(p, params.price, params.max_tokens)
        batch.clear()

    for p in prompts:
        result.total += 1
        hashed += bytes.fromhex(hash_of(p))
        batch.append(p)
        if len(batch) == 4096:
            settle()
    settle()
    return bytes(hashed), keys.tobytes(), bytes(done), n_todo, worst


def _known_pass(known: tuple[bytes, bytes], prompts: Any, index: JournalIndex,
                params: GenerateParams) -> tuple[bytes, bytes, bytes, int, float]:
    """The same from known hashes and digests (hashcache.py): one vectorised journal lookup."""
    import numpy as np

    hashed, keys = known
    flags = index.is_done(index.lookup(np.frombuffer(keys, dtype=np.uint64), hash64_array(hashed)))
    n_todo, worst = int(len(flags) - flags.sum()), 0.0
    if n_todo:   # sizes for the budget's worst case, read only when something is to be sent
        worst = sum(worst_case(p, params.price, params.max_tokens)
                    for p, d in zip(prompts.ids(sizes=True), flags.tolist()) if not d)
    return hashed, keys, flags.tobytes(), n_todo, worst


@dataclass
class _Spend:
    """One prompt's money while it is in progress: the worst cases reserved for its attempts (held
    until its finished line is durable), what the attempts cost, and the reservation ids that line
    settles (journal.py)."""
    held: float = 0.0
    cost: float = 0.0
    ids: list[str] = field(default_factory=list)


class _Runner:
    def __init__(self, params: GenerateParams, target: Target, policy: Policy, result: RunResult,
                 seed: int, progress: Progress | None):
        self.p = params
        self.target = target
        self.secrets = target.secrets
        self.policy = policy
        self.r = result
        self.rng = random.Random(seed)
        self.progress = progress
        self.pause = PauseGate(policy)
        self.budget = Budget(params.budget_usd, params.price, params.max_tokens, spent=result.spent_before_usd)
        self.settled = asyncio.Condition()
        # Prompts in progress that are not waiting for the budget: only they can still settle and
        # free a reservation, so a waiter gives up when there are none.
        self.busy = 0
        # Reservation ids: this run's random prefix and a counter (unique across runs and kills).
        self.run_id, self.seq = os.urandom(6).hex(), 0
        self.client: ChatClient | None = None
        self.journal: Journal | None = None

    async def run(self, todo: Iterator[tuple[Prompt, str]], n_todo: int, worst: float, journal: Journal) -> None:
        self.journal = journal
        self.client = ChatClient(self.target.base_url, self.target.api_key, self.p.concurrency,
                                 self.target.headers)
        # What is left after a budget stop is counted, not listed: the prompts stream.
        self.n_todo, self.todo_worst, self.n_started, self.started_worst = n_todo, worst, 0, 0.0
        it = iter(todo)
        t0 = time.monotonic()
        if self.progress:
            self.progress.start()
        # Thousands of live coroutines make default-threshold gen-0 collections frequent and
        # wide; a larger threshold for the run cut client CPU per request ~20% (bench/client.py).
        gc_threshold = gc.get_threshold()
        gc.set_threshold(max(gc_threshold[0], 20_000), *gc_threshold[1:])
        try:
            workers = [asyncio.create_task(self._worker(it)) for _ in range(min(self.p.concurrency, n_todo))]
            try:
                await asyncio.gather(*workers)
            except BaseException:
                for w in workers:
                    w.cancel()
                raise
        finally:
            gc.set_threshold(*gc_threshold)
            await self.client.aclose()
            self.r.elapsed_s = time.monotonic() - t0
            self.r.spent_usd = self.budget.spent - self.r.spent_before_usd
            self.r.pauses_429 = self.pause.pauses
            if self.progress:
                self.progress.close()
        self.r.unsent = self.r.total - self.r.skipped - self.r.sent

    def stop(self, reason: str, detail: str) -> None:
        if self.r.stop_reason is None:
            self.r.stop_reason, self.r.stop_detail = reason, detail
            print(f"\ngenerate: stopping the run ({reason}): {detail}", file=sys.stderr)

    async def _worker(self, it: Iterator[tuple[Prompt, str]]) -> None:
        while self.r.stop_reason is None:
            item = next(it, None)
            if item is None:
                return
            prompt, rhash = item
            worst = self.budget.worst_case(prompt)
            if not await self._admit(worst, retry=False):
                self.stop("budget", self._budget_stop(worst))
                return
            spend = _Spend(held=worst)
            self.busy += 1
            self.r.sent += 1
            self.n_started += 1
            self.started_worst += worst
            try:
                record = await self._request(prompt, rhash, worst, spend)
                await self.journal.append(record)   # durable before anything else happens with it
            finally:
                # Its reservations are settled on disk now: the held worst cases become the real cost.
                self.busy -= 1
                self.budget.settle(spend.held, spend.cost)
                self._notify_soon()
            self._account(record)

    async def _admit(self, worst: float, retry: bool) -> bool:
        """Reserve `worst` (in memory) for the next request when the budget covers it, waiting while
        prompts in progress may still settle and free theirs; False when it cannot be covered.
        A retry's prompt stops counting as busy while it waits (else two waiting retries would wait
        for each other)."""
        b = self.budget
        if not b.fits(worst) and self.r.stop_reason is None:
            if retry:
                self.busy -= 1
                self._notify_soon()
            try:
                async with self.settled:
                    await self.settled.wait_for(
                        lambda: b.fits(worst) or self.busy == 0 or self.r.stop_reason is not None)
            finally:
                if retry:
                    self.busy += 1
        # After a budget stop, retries of prompts in progress may still go out when they fit.
        if not b.fits(worst) or self.r.stop_reason not in (None, "budget") or (self.r.stop_reason and not retry):
            return False
        b.reserve(worst)
        return True

    async def _journal_reservation(self, base: dict[str, Any], attempt: int, worst: float, spend: _Spend) -> None:
        """The write-ahead line of one request (journal.py): durable before the request is sent."""
        if worst <= 0:   # a free request: nothing to bound, no line
            return
        rid = f"{self.run_id}:{self.seq}"
        self.seq += 1
        spend.ids.append(rid)
        self.r.reservations += 1
        await self.journal.append({**base, "status": "reserved", "reservation": rid, "attempt": attempt,
                                   "worst_case_usd": worst})

    def _budget_stop(self, worst: float, retry: bool = False) -> str:
        b, r = self.budget, self.r
        left = self.n_todo - self.n_started
        need = max(self.todo_worst - self.started_worst, 0.0) + (worst if retry else 0.0)
        held = f", ${b.reserved:.4f} more reserved by requests in progress," if b.reserved > 1e-12 else ""
        return (f"the journal has spent ${b.spent:.4f} in total over every run (${b.spent - r.spent_before_usd:.4f} "
                f"in this one){held} of generate.budget_usd ${b.limit_usd:.4f}, which bounds the whole journal; the "
                f"next request's worst case ${worst:.6f} does not fit{' (a retry)' if retry else ''}. {left} prompts "
                f"are left{' besides it' if retry else ''}, up to ${need:.4f} if each is answered once: to continue, "
                f"set generate.budget_usd to at least ${b.spent + b.reserved + need:.4f} and rerun (finished prompts "
                "are kept, nothing is bought twice)")

    def _account(self, rec: dict[str, Any]) -> None:
        r = self.r
        r.spent_usd = self.budget.spent - r.spent_before_usd
        usage = rec.get("usage") or {}
        if rec["status"] == "ok":
            r.ok += 1
            r.providers[rec.get("provider") or "unknown"] += 1
            r.finish_reasons[rec.get("finish_reason") or "none"] += 1
            r.prompt_tokens += usage.get("prompt_tokens") or 0
            r.completion_tokens += usage.get("completion_tokens") or 0
            r.redacted_answers += bool(set(rec.get("redacted") or ()) & set(MODEL_OUTPUT))
        else:
            r.failed += 1
            r.failures[rec["failure_reason"]] += 1
        r.wasted_usd += rec.get("wasted_cost_usd") or 0.0
        for f in rec.get("failed_attempts") or ():
            r.paid_failed_attempts += bool(f.get("cost_usd"))
            r.lost_attempts += "worst_case_usd" in f
            r.wasted_worst_case_usd += f.get("worst_case_usd") or 0.0
            r.failed_attempts_by_provider[f.get("provider") or "unknown"] += 1
        r.attempts += rec.get("attempts") or 0
        if self.progress:
            self.progress.finished(rec["status"] == "ok", usage.get("completion_tokens") or 0, r.spent_usd)

    def _notify_soon(self) -> None:
        if self.budget.limit_usd > 0:
            asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self.settled:
            self.settled.notify_all()

    async def _request(self, prompt: Prompt, rhash: str, worst: float, spend: _Spend) -> dict[str, Any]:
        """All attempts for one prompt -> its journal record. `spend` collects what they reserved
        and cost (billed, lost at worst case). The first attempt's worst case is already reserved."""
        body = encode_body(build_body(prompt, self.p))
        base = {"prompt_id": prompt.prompt_id, "request_hash": rhash}
        failures: list[dict[str, Any]] = []
        t_start = time.monotonic()
        verdict: Verdict | None = None
        attempt = 0
        for attempt in range(1, self.p.max_attempts + 1):
            await self.pause.wait()
            # After a budget stop in-flight prompts still finish (each retry if the budget covers
            # it); after a 401/credits stop nothing more is sent.
            if self.r.stop_reason not in (None, "budget"):
                return self._failed(base, "stopped", f"stopped_{self.r.stop_reason}", verdict, failures,
                                    attempt - 1, t_start, spend)
            # What this attempt adds to the prompt's reservations: its worst case, less what the
            # earlier attempts left of theirs (a free 429 leaves all of it, a lost answer none;
            # attempts billed above their worst case never make a retry reserve more than its own).
            extra = worst if attempt == 1 else min(worst, max(0.0, spend.cost + worst - spend.held))
            if attempt > 1 and extra > 1e-12:
                if not await self._admit(extra, retry=True):
                    if self.r.stop_reason not in (None, "budget"):
                        return self._failed(base, "stopped", f"stopped_{self.r.stop_reason}", verdict, failures,
                                            attempt - 1, t_start, spend)
                    self.r.refused_retries += 1
                    self.stop("budget", self._budget_stop(extra, retry=True))
                    return self._failed(base, "stopped", "budget", verdict, failures, attempt - 1, t_start, spend)
                spend.held += extra
            if extra > 1e-12:
                await self._journal_reservation(base, attempt, extra, spend)
            t = time.monotonic()
            verdict, comp, cost, failure = await self._attempt(body, worst)
            spend.cost += cost
            if comp is not None:
                rec = self._ok(base, comp, failures, attempt, time.monotonic() - t, t_start, spend.cost - cost, cost,
                               spend.ids)
                if comp.usage is None and cost:
                    rec["cost_is_worst_case"] = True   # no usage came back: the bill is unknown
                return rec
            failures.append(failure)
            if verdict.kind == "stop":
                self.stop(verdict.cause, verdict.detail)
                return self._failed(base, "stopped", verdict.cause, verdict, failures, attempt, t_start, spend)
            if verdict.kind == "final":
                return self._failed(base, "permanent", verdict.cause, verdict, failures, attempt, t_start, spend)
            if attempt == self.p.max_attempts:
                break
            self.r.retries[verdict.cause] += 1
            if self.progress:
                self.progress.error(verdict.cause)
            if verdict.cause == "http_429":
                self.pause.note_429(verdict.wait_s, attempt, self.rng)
            await asyncio.sleep(self.policy.backoff_s(attempt, self.rng, verdict.wait_s))
        return self._failed(base, "exhausted", verdict.cause, verdict, failures, attempt, t_start, spend)

    async def _attempt(self, body: bytes, worst: float) -> tuple[Verdict | None, Completion | None, float, dict | None]:
        """One HTTP request -> (verdict, completion, cost, journal entry of a failure).

        The cost is what was billed, or for a lost answer (the bill never seen) the worst case.
        Everything derived from the answer is already without the secrets (redact.py)."""
        secrets = self.secrets
        try:
            async with asyncio.timeout(self.p.timeout_s):
                resp = await self.client.post(body)
        except Exception as e:   # classify_exception re-raises anything that is not transport/timeout
            v = classify_exception(e)
            v = replace(v, detail=redact(v.detail, secrets))
            # The request may have been answered and billed; only a refused connection sent nothing.
            if v.cause == "connect":
                return v, None, 0.0, self._failure(v)
            return v, None, worst, self._failure(v, worst_case=worst)
        verdict = classify_status(resp.status_code, resp.headers, resp.content, secrets)
        if verdict is not None:
            info = error_info(resp.content, secrets)
            cost = cost_of(info.usage, self.p.price)
            return verdict, None, cost, self._failure(verdict, resp.status_code, resp.headers, info, None, cost)
        try:
            comp = parse_completion(resp.content, secrets)
        except BadBody as b:
            v = Verdict("retry", b.cause, b.detail)
            if b.usage is None:   # a 2xx whose bill cannot be read: generated, so maybe billed
                return v, None, worst, self._failure(v, resp.status_code, resp.headers, b.error, b.completion,
                                                     worst_case=worst)
            cost = cost_of(b.usage, self.p.price)
            return v, None, cost, self._failure(v, resp.status_code, resp.headers, b.error, b.completion, cost,
                                                b.usage)
        if comp.provider is None and self.p.backend == "vllm":
            # vLLM names no provider in its body; its rows are billed by vLLM's convention, which
            # reconstruct.billing declares under this name (a vLLM counts the end token it stopped on).
            comp = replace(comp, provider="vllm")
        if comp.generation_id is None and resp.headers.get("x-generation-id"):
            gid = redact(resp.headers["x-generation-id"], secrets, patterns=False)
            redacted = comp.redacted + (("generation_id",) if gid != resp.headers["x-generation-id"] else ())
            comp = replace(comp, generation_id=gid, redacted=tuple(sorted(set(redacted))))
        return None, comp, cost_of(comp.usage, self.p.price) if comp.usage else worst, None

    def _failure(self, v: Verdict, status: int | None = None, headers: Any = None, info: ErrorInfo | None = None,
                 comp: Completion | None = None, cost: float = 0.0,
                 usage: dict[str, Any] | None = None, worst_case: float | None = None) -> dict[str, Any]:
        """The journal entry of one failed attempt: what failed, who, what it cost, what came back."""
        secrets = self.secrets
        entry: dict[str, Any] = {"cause": v.cause, "detail": redact(v.detail, secrets)[:500]}
        if status is not None:
            entry["http_status"] = status
        if headers is not None and headers.get("x-generation-id"):
            entry["generation_id"] = redact(headers["x-generation-id"], secrets, patterns=False)
        if info is not None:
            entry["provider"] = info.provider
            if info.metadata:
                entry["metadata"] = redact(info.metadata, secrets)
            usage = usage or info.usage
        if comp is not None:
            # The paid answer as received, without the secrets (parse_completion scrubbed it).
            entry.update({k: x for k, x in asdict(comp).items() if x is not None and x != ()})
        if usage is not None:
            entry["usage"] = usage
        if cost or usage is not None:
            entry["cost_usd"] = cost
        if worst_case is not None:
            entry["worst_case_usd"] = worst_case   # a lost answer, possibly billed: counted at its worst case
        return {k: x for k, x in entry.items() if x is not None}

    @staticmethod
    def _ok(base: dict, c: Completion, failures: list[dict], attempts: int, latency: float, t_start: float,
            wasted: float, cost: float, reservations: list[str]) -> dict[str, Any]:
        rec = {**base, "status": "ok", "failure_reason": None, "failure_kind": None,
               "generation_id": c.generation_id, "provider": c.provider, "model": c.model,
               "finish_reason": c.finish_reason, "native_finish_reason": c.native_finish_reason,
               "reasoning": c.reasoning, "reasoning_details": c.reasoning_details, "content": c.content,
               "tool_calls": c.tool_calls, "usage": c.usage, "cost_usd": cost, "logprobs": c.logprobs,
               "token_ids": c.token_ids, "prompt_token_ids": c.prompt_token_ids, "attempts": attempts,
               "retry_causes": [f["cause"] for f in failures], "failed_attempts": failures,
               "latency_s": round(latency, 4), "elapsed_s": round(time.monotonic() - t_start, 4),
               "wasted_cost_usd": wasted, "finished_at": round(time.time(), 3)}
        if c.redacted:
            rec["redacted"] = list(c.redacted)   # the row is quarantined downstream (redact.py)
        if reservations:
            rec["reservations"] = reservations   # settled by this line (journal.py)
        return rec

    @staticmethod
    def _failed(base: dict, kind: str, reason: str, v: Verdict | None, failures: list[dict], attempts: int,
                t_start: float, spend: _Spend) -> dict[str, Any]:
        last = failures[-1] if failures else {}
        rec = {**base, "status": "failed", "failure_reason": reason, "failure_kind": kind,
               "detail": last.get("detail", v.detail[:500] if v else ""), "provider": last.get("provider"),
               "attempts": attempts, "retry_causes": [f["cause"] for f in failures], "failed_attempts": failures,
               "elapsed_s": round(time.monotonic() - t_start, 4), "wasted_cost_usd": spend.cost,
               "finished_at": round(time.time(), 3)}
        if spend.ids:
            rec["reservations"] = spend.ids
        return rec
