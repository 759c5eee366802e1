"""Dynamic batching for the local server: one worker, one generation thread.

Concurrent requests queue; the worker waits up to `wait_s` for up to `max_batch` of them, then
generates them together on a single generation thread, so the event loop stays free and every
tokenizer call stays on the loop. Streamed requests get each step through a queue, in order.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from draftgate.serve.model import Generation, LocalModel, Sampling, Step, generate_batch


@dataclass
class _Job:
    prompt: list[int]
    sampling: Sampling
    future: asyncio.Future
    stream: asyncio.Queue | None


@dataclass
class Batcher:
    lm: LocalModel
    max_batch: int
    wait_s: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    batch_sizes: Counter = field(default_factory=Counter)
    completion_tokens: int = 0
    busy_s: float = 0.0
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "draftgate-generate"))

    async def submit(self, prompt: list[int], sampling: Sampling, stream: asyncio.Queue | None = None) -> Generation:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Job(prompt, sampling, future, stream))
        return await future

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self.queue.get()]
            deadline = loop.time() + self.wait_s
            while len(jobs) < self.max_batch:
                try:
                    jobs.append(self.queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    jobs.append(await asyncio.wait_for(self.queue.get(), left))
                except TimeoutError:
                    break
            await self._run_batch(loop, jobs)

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job]) -> None:
        sinks = [j.stream for j in jobs]

        def on_step(row: int, step: Step) -> None:   # generation thread -> loop, in order
            if sinks[row] is not None:
                loop.call_soon_threadsafe(sinks[row].put_nowait, step)

        self.batch_sizes[len(jobs)] += 1
        start = time.perf_counter()
        try:
            gens = await loop.run_in_executor(
                self.executor, generate_batch, self.lm, [j.prompt for j in jobs], [j.sampling for j in jobs],
                on_step if any(s is not None for s in sinks) else None)
        except Exception as e:   # one bad batch must not kill the worker; every request hears why
            for j in jobs:
                if j.stream is not None:
                    j.stream.put_nowait(None)
                if not j.future.done():
                    j.future.set_exception(e)
            return
        finally:
            self.busy_s += time.perf_counter() - start
        for j, g in zip(jobs, gens):
            self.completion_tokens += len(g.steps)
            if j.stream is not None:
                j.stream.put_nowait(None)      # after every step: call_soon_threadsafe is FIFO
            if not j.future.done():
                j.future.set_result(g)

    def stats(self) -> dict[str, Any]:
        return {"requests": sum(k * v for k, v in self.batch_sizes.items()),
                "batches": sum(self.batch_sizes.values()),
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "max_batch_seen": max(self.batch_sizes, default=0),
                "completion_tokens": self.completion_tokens, "busy_s": round(self.busy_s, 3),
                "queued": self.queue.qsize()}
