"""A live status line on stderr: done/total, req/s, tok/s, $ spent, errors by kind, ETA.

On a terminal the line is rewritten at most twice a second; otherwise (CI, DVC logs) a plain line
is printed every `plain_every_s` seconds, plus a final one.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, plain_every_s: float = 10.0):
        self.total = total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every = 0.5 if self.tty else plain_every_s
        self.done = 0
        self.ok = 0
        self.tokens = 0
        self.spent = 0.0
        self.errors: Counter = Counter()
        self.t0 = time.monotonic()
        self._task: asyncio.Task | None = None

    def finished(self, ok: bool, completion_tokens: int, spent: float) -> None:
        self.done += 1
        self.ok += ok
        self.tokens += completion_tokens
        self.spent = spent

    def error(self, cause: str) -> None:
        self.errors[cause] += 1

    def line(self) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        rate = self.done / dt
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        errs = " ".join(f"{k}={v}" for k, v in self.errors.most_common(4))
        return (f"generate {self.done}/{self.total} ({self.done - self.ok} failed) {rate:.1f} req/s "
                f"{self.tokens / dt:.0f} tok/s ${self.spent:.4f} ETA {_dur(eta)}"
                + (f" | retries: {errs}" if errs else ""))

    def _emit(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self.line())
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            self._emit()

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._task = asyncio.create_task(self._tick())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._emit()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _dur(s: float) -> str:
    if s == float("inf"):
        return "?"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
