"""The tiktoken fast path for ordinary encodes, and the choice of threads for a large batch.

Only for tiktoken-family vocabularies with no normaliser or NFC: text is normalised the way the
tokenizer's own Rust normaliser would (skipped where a C quick check proves it a no-op), then
encoded by tiktoken's public API in contiguous chunks, on one thread or one per core, whichever
recent calls measured faster (ThreadChoice). tests/test_tokenizers.py fuzzes it against the
Rust encoder.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from typing import Any, Callable

# Below this many characters a batch is encoded on the calling thread (no pool start-up).
TIKTOKEN_CHUNK_CHARS = 200_000


def tiktoken_batch(enc: Any, texts: list[str], nfc: Callable[[str], str] | None) -> list[list[int]]:
    """Ordinary ids of every text through a tiktoken Encoding, normalised first as the tokenizer's
    own NFC normaliser would (`nfc`; None: the vocabulary has no normaliser)."""
    # tiktoken's own encode_ordinary_batch submits one thread-pool future per text: ~20 us each,
    # 5x slower than the Rust path on 75k short segments. Contiguous chunks per thread keep
    # its speed on long texts without that cost (the Rust call releases the GIL).
    encode = strict_encoder(enc)
    if nfc is not None:
        unchanged = _nfc_quick_check()

    def run(chunk: list[str]) -> list[list[int]]:
        if nfc is not None:
            # ASCII is NFC in every Unicode version; other text goes through the tokenizer's own
            # normaliser unless a C quick check proves it would come back unchanged.
            chunk = [t if t.isascii() or unchanged(t) else nfc(t) for t in chunk]
        return list(map(encode, chunk))

    chars = sum(map(len, texts))
    if chars < TIKTOKEN_CHUNK_CHARS:
        return run(texts)
    threads = ENCODE_THREADS.pick(len(os.sched_getaffinity(0)))
    started = time.perf_counter()
    if threads < 2:
        out = run(texts)
    else:
        from concurrent.futures import ThreadPoolExecutor

        size = -(-len(texts) // (threads * 4))
        with ThreadPoolExecutor(threads) as pool:
            parts = pool.map(run, [texts[i:i + size] for i in range(0, len(texts), size)])
            out = [ids for part in parts for ids in part]
    ENCODE_THREADS.record(threads, time.perf_counter() - started, chars)
    return out


class ThreadChoice:
    """One thread or one per core for the next large encode: whichever recent calls measured
    faster per character, the other tried every EXPLORE-th call so that a change in load shows.

    Neither wins everywhere. Each text hands the GIL back to build its id list; with a core
    idle two threads make the encode ~1.5x faster (2 cores), but on a machine whose cores are
    all busy a thread preempted while holding the GIL stalls the other for a time slice, and
    one thread is ~20-30% faster (both measured on the shared 2-core machine, 4,000 bench
    rows). The load average cannot tell in time (it lags, and counts this process), so the
    calls are timed.
    """

    EXPLORE = 6

    def __init__(self) -> None:
        self.cost: dict[int, float] = {}    # threads -> seconds per character, moving average
        self.calls = 0
        self.used: Counter[int] = Counter()  # threads -> calls (the benchmark reports it)
        self.pinned: int | None = None      # pin(): this count always, nothing measured

    def pin(self, threads: int) -> None:
        """Always `threads`, whatever the timings say: a worker process of a pool whose processes
        are the parallelism (reconstruct/parallel.py) encodes on its own thread only."""
        self.pinned = threads

    def pick(self, cpus: int) -> int:
        if self.pinned is not None:
            return self.pinned
        many = min(cpus, 8)
        if many < 2:
            return 1
        self.calls += 1
        untried = [k for k in (many, 1) if k not in self.cost]
        if untried:
            return untried[0]
        best = min((many, 1), key=self.cost.__getitem__)
        if self.calls % self.EXPLORE == 0:
            return 1 if best == many else many
        return best

    def record(self, threads: int, seconds: float, chars: int) -> None:
        cost = seconds / max(chars, 1)
        old = self.cost.get(threads)
        self.cost[threads] = cost if old is None else (old + cost) / 2
        self.used[threads] += 1


ENCODE_THREADS = ThreadChoice()     # per process: the load it measures is the machine's


def strict_encoder(enc: Any) -> Callable[[str], list[int]]:
    """tiktoken's public `encode_ordinary`, refusing a lone surrogate as the Rust encoder does
    (UnicodeEncodeError): tiktoken's wrapper would swap in U+FFFD and encode other text. Only
    non-ASCII text can hold one; UTF-8-encoding it is the check (C, ~1 GB/s). The private
    `enc._core_bpe.encode_ordinary` raised by itself but was no faster (bench/tokenizers_private.py)."""
    encode = enc.encode_ordinary

    def strict(text: str) -> list[int]:
        if not text.isascii():
            text.encode("utf-8")
        return encode(text)
    return strict


@functools.cache
def _nfc_quick_check() -> Callable[[str], bool]:
    """A test that may stand in for running the tokenizers library's NFC normaliser: where it
    says True, that normaliser would return the text unchanged.

    Python's `unicodedata.is_normalized` (C, ~1 ns/char) answers from Python's Unicode tables
    (14.0 on 3.11); the Rust normaliser has its own (9.0 in tokenizers 0.23). Unicode's stability
    policy fixes the decomposition, combining class and compositions of every assigned character,
    so both agree on every character both know; a character only Python knows is an inert
    starter to Rust, which can only block reorderings and compositions, never add one. So while
    Python's tables are the newer, NFC for Python means unchanged for Rust. That premise is
    probed, not assumed: every code point of planes 0-1 (where Unicode adds combining marks)
    that Python leaves unassigned must pass Rust's NFC untouched, beside marks of class 220 and
    240 (a mark of any other class would be reordered there). If Rust's tables are the newer,
    the check always says False and every non-ASCII text is normalised by Rust, as before.
    Once per process, ~0.1 s. tests/test_tokenizers.py checks the equivalence on hostile text.
    """
    import unicodedata

    from tokenizers.normalizers import NFC

    category = unicodedata.category
    unknown = [chr(c) for c in range(0x20000) if category(chr(c)) == "Cn"]
    probe = "".join(f"a{c}\u0316a\u0345{c} " for c in unknown)
    if NFC().normalize_str(probe) != probe:
        return lambda _text: False
    return functools.partial(unicodedata.is_normalized, "NFC")
