"""What to do after one attempt: retry (and how long to wait), give up on the prompt, or stop the run.

Policy (docs/openrouter.md, "Errors and retries"):
- 400, 403 (moderation): final for that prompt; rerunning will not change the answer.
- 401, 402 credits/key limit, 403 with a budget `limit_source`: stop the whole run; every other
  prompt would fail the same way. Rerun after fixing the key or adding credits.
- 402 with `limit_source: openrouter_in_flight_budget`: retry after Retry-After.
- 408, 429, 5xx, connection errors, timeouts, and 200s with an error body, empty output,
  `finish_reason: error`, malformed JSON or junk content (a leaked provider error, serialised
  content parts: another attempt, often on another provider, usually answers): retry with backoff.
- `x-should-retry: true|false` overrides retry/final (never a stop).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Literal, Mapping

from draftgate.client.response import error_info

IN_FLIGHT_BUDGET = "openrouter_in_flight_budget"


@dataclass(frozen=True)
class Verdict:
    kind: Literal["retry", "final", "stop"]
    cause: str                  # reason code: http_429, timeout, empty_output, auth_401, ...
    detail: str = ""
    wait_s: float | None = None  # the server's Retry-After, when it sent one


@dataclass(frozen=True)
class Policy:
    base_s: float = 0.5
    max_s: float = 8.0
    retry_after_cap_s: float = 60.0
    # A global pause starts when this many 429s arrive within the window.
    burst_429: int = 3
    burst_window_s: float = 2.0

    def backoff_s(self, attempt: int, rng: random.Random, hint: float | None = None) -> float:
        """Wait before attempt `attempt + 1`: the server's hint (capped) or jittered exponential."""
        if hint is not None and hint >= 0:
            return min(hint, self.retry_after_cap_s)
        exp = min(self.base_s * 2 ** (attempt - 1), self.max_s)
        return exp * (0.75 + 0.25 * rng.random())   # jitter down to 75%, like openai-python


def classify_status(status: int, headers: Mapping[str, str], body: bytes,
                    secrets: tuple[str, ...] = ()) -> Verdict | None:
    """None for a 2xx (parse it); otherwise the verdict (its detail without `secrets`: redact.py)."""
    if 200 <= status < 300:
        return None
    info = error_info(body, secrets)
    source = str(info.metadata.get("limit_source") or "")
    detail = (f"HTTP {status} {info.message}" + (f" (provider {info.provider})" if info.provider else "")
              + (f" (limit_source {source})" if source else ""))
    wait = retry_after_s(headers)
    if status == 401:
        return Verdict("stop", "auth_401", detail + "; check the API key in the environment variable")
    if status == 402:
        if source == IN_FLIGHT_BUDGET:
            return _override(Verdict("retry", "http_402_inflight", detail, wait), headers)
        return Verdict("stop", "credits_402", detail + "; add credits or raise the key's limit, then rerun")
    if status == 403 and source:
        return Verdict("stop", "limit_403", detail + "; the key/workspace budget is spent")
    if status in (400, 403, 404, 413, 422):
        return _override(Verdict("final", f"http_{status}", detail), headers)
    return _override(Verdict("retry", f"http_{status}", detail, wait), headers)


def _override(v: Verdict, headers: Mapping[str, str]) -> Verdict:
    flag = (headers.get("x-should-retry") or "").strip().lower()
    if flag == "true" and v.kind == "final":
        return Verdict("retry", v.cause, v.detail + " (x-should-retry: true)", v.wait_s)
    if flag == "false" and v.kind == "retry":
        return Verdict("final", v.cause, v.detail + " (x-should-retry: false)")
    return v


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:   # an HTTP date
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class PauseGate:
    """Holds every sender while a burst of 429s says the rate limit is hit, honouring Retry-After."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.until = 0.0
        self.pauses = 0
        self._recent: list[float] = []

    def note_429(self, wait_s: float | None, attempt: int, rng: random.Random) -> None:
        now = time.monotonic()
        window = self.policy.burst_window_s
        self._recent = [t for t in self._recent if now - t < window] + [now]
        if len(self._recent) >= self.policy.burst_429:
            until = now + self.policy.backoff_s(attempt, rng, wait_s)
            if until > self.until:
                if self.until < now:
                    self.pauses += 1
                self.until = until

    async def wait(self) -> None:
        while (left := self.until - time.monotonic()) > 0:
            await asyncio.sleep(left)


def classify_exception(exc: BaseException) -> Verdict:
    import httpx

    if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
        return Verdict("retry", "timeout", f"no complete answer in time ({type(exc).__name__})")
    if isinstance(exc, httpx.ConnectError):
        return Verdict("retry", "connect", f"{type(exc).__name__}: {exc}")
    if isinstance(exc, (httpx.TransportError, OSError)):
        return Verdict("retry", "connection", f"{type(exc).__name__}: {exc}")
    raise exc
