"""Every prompt's request hash, kept beside the journal so a rerun with nothing to send neither
parses nor hashes 500K prompts again (~6 of the ~17 CPU seconds such a rerun took).

A cache, never a record: delete it and the next run rebuilds it. It is used only when its key
matches and a sample of its hashes, recomputed from the prompts, agrees. The key names what a
request hash depends on: the prompt file's bytes (sha256), the rows in scope, and the request
hash of an empty prompt under the current params and served identity, which moves with every
field of the body, the backend and the model build (request.py). The sample guards what the key
cannot see, a change to how messages and tools are hashed: it would change every hash.

File: one JSON header line {"key", "rows"}, then each prompt's request hash (32 raw bytes), then
each prompt id's journal digest (journal.digest64, 8 bytes), both in prompt order.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from draftgate.client.request import Prompt, build_body, request_hash
from draftgate.config import GenerateParams
from draftgate.io import file_sha256

SAMPLE = 32   # hashes recomputed from the prompts before the cache is trusted


def cache_path(journal: str | Path) -> Path:
    return Path(f"{journal}.hashes")


def cache_key(prompts_sha256: str, rows: int, params: GenerateParams, identity: dict[str, str] | None) -> str:
    empty = request_hash(build_body(Prompt("", "", [], None, 0), params), params.backend, identity)
    return hashlib.sha256(f"{prompts_sha256}\n{rows}\n{empty}".encode()).hexdigest()


def load(path: str | Path, key: str, rows: int) -> tuple[bytes, bytes] | None:
    """(request hashes, prompt id digests), or None when the file is missing, torn or for
    another key."""
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline())
            if header.get("key") != key or header.get("rows") != rows:
                return None
            data = f.read()
    except (OSError, ValueError, AttributeError):
        return None
    return (data[:32 * rows], data[32 * rows:]) if len(data) == 40 * rows else None


def save(path: str | Path, key: str, hashes: bytes, keys: bytes) -> None:
    from draftgate.io import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(json.dumps({"key": key, "rows": len(hashes) // 32}).encode() + b"\n")
        f.write(hashes)
        f.write(keys)


def checked(prompts, params: GenerateParams, identity: dict[str, str] | None,
            journal: str | Path) -> tuple[str, tuple[bytes, bytes] | None]:
    """(the cache key for this run, the cached hashes and digests when the key matches and the
    sample agrees). `prompts`: a table.PromptFile."""
    from draftgate.client.journal import digest64

    rows = len(prompts)
    key = cache_key(file_sha256(prompts.path), rows, params, identity)
    cached = load(cache_path(journal), key, rows)
    if cached is None:
        return key, None
    sample = prompts.rows_at(sample_rows(rows))
    hashes, keys = cached
    if not agrees(hashes, sample, lambda p: request_hash(build_body(p, params), params.backend, identity)):
        return key, None
    if any(int.from_bytes(keys[8 * i:8 * i + 8], "little") != digest64(p.prompt_id) for i, p in sample.items()):
        return key, None
    return key, cached


def agrees(hashes: bytes, sample: dict[int, Prompt], hash_of: Callable[[Prompt], str]) -> bool:
    """Whether the cached hash of each sampled prompt (row number -> prompt) is its hash now."""
    return all(hashes[32 * i:32 * i + 32].hex() == hash_of(p) for i, p in sample.items())


def sample_rows(rows: int, n: int = SAMPLE) -> list[int]:
    """Spread over the file, first and last row included."""
    if rows <= n:
        return list(range(rows))
    return sorted({round(j * (rows - 1) / (n - 1)) for j in range(n)})
