"""Chunks reconstructed in forked worker processes, their results taken back in chunk order.

Most of reconstruct's time is Python per row (render, plan, compare, flags, seq-rep-4, to_arrow),
which one process runs on one core; only the encode ran in threads. So whole chunks go to worker
processes, one per usable CPU. They are forked ("fork" context) after the Setup exists and
inherit it (tokenizer, template, index) in memory: nothing of it is pickled. What crosses the
pipes per chunk is its Arrow tables as IPC bytes (pickling a pa.Table cost ~1.1 s for the bench's
20,000 rows, IPC 0.09 s), a few prompt rows, counts and numpy facts.

Results are taken in submission order, with at most IN_FLIGHT chunks per worker submitted ahead:
the caller sees exactly the serial path's sequence, and memory stays bounded. A worker encodes on
one thread (its processes are the parallelism), tiktoken and the HF tokenizers' Rust pool alike.
An exception in a worker is raised by `imap` as itself (same type and message; the worker's
traceback as its __cause__); a worker that dies raises BrokenProcessPool. Either way the pool
is shut down on the way out.
"""

from __future__ import annotations

import os
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

# Worker processes at most, whatever the CPU count: one core's worth of parent work (reading,
# writing the part file) is shared with them.
MAX_WORKERS = 8
# Chunks submitted ahead per worker: one running, one queued, so a worker never waits for the
# parent; more would only hold more chunks in memory.
IN_FLIGHT = 2

_state: Any = None      # in a worker: what the pool was started with


def workers(rows: int, chunk: int) -> int:
    """Processes for `rows` in chunks of `chunk`: one per usable CPU (at most MAX_WORKERS and one
    per chunk); 1 (the serial path) on one CPU or for a single chunk."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS, -(-rows // max(chunk, 1))))


class Pool:
    """`with Pool(n, state) as pool: for out in pool.imap(fn, tasks)`: fn(state, *task) in n
    forked processes; `state` is inherited, never pickled; fn must be a module-level function."""

    def __init__(self, processes: int, state: Any):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.processes = processes
        self._pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"),
                                         initializer=_start, initargs=(state,))
        # With "fork" the first submit forks every worker; the Rust tokenizers library reads
        # TOKENIZERS_PARALLELISM at each call, so the children are forked with it off (no
        # rayon pool in a child, and no "process just got forked" warning) while the parent's
        # own setting is left as it was.
        try:
            with _environ("TOKENIZERS_PARALLELISM", "false"):
                self._pool.submit(int).result()
        except BaseException:
            self._pool.shutdown(wait=True, cancel_futures=True)
            raise

    def imap(self, fn: Callable[..., Any], tasks: Iterable[tuple]) -> Iterator[Any]:
        pending: deque = deque()
        for task in tasks:
            pending.append(self._pool.submit(_call, fn, *task))
            if len(pending) >= IN_FLIGHT * self.processes:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: Any) -> None:
        # On an error, chunks not started are dropped; the running ones finish (a chunk: ~0.2 s).
        self._pool.shutdown(wait=True, cancel_futures=True)


def _start(state: Any) -> None:
    from draftgate.tokenizers import ENCODE_THREADS

    global _state
    _state = state
    ENCODE_THREADS.pin(1)


def _call(fn: Callable[..., Any], *task: Any) -> Any:
    return fn(_state, *task)


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def to_ipc(data: Any) -> bytes:
    """A table or record batch as Arrow IPC stream bytes."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as w:
        w.write(data)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> Any:
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all()
