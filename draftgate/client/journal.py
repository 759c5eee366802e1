"""The responses journal: one JSON line per finished request, durable before anything else happens.

Writes are group commits: lines finished in the same instant are written together, fsynced once,
and only then do their waiters continue (stats, progress, budget, or the request itself). A
`kill -9` therefore loses at most the answers still in flight. A torn last line (a crash
mid-write) is detected on the next open: it is counted, terminated with a newline so the next
append cannot glue onto it, and ignored.

Write-ahead budget. Before any HTTP request is sent (a first try or a retry), a reservation line
is committed: `{"status": "reserved", "reservation": ID, "prompt_id", "request_hash", "attempt",
"worst_case_usd"}`, the request's worst case at generate.price (client/budget.py). The prompt's
finished line settles every reservation it lists in `reservations` with what its attempts really
cost (`budget.line_cost`). A reservation no finished line settles is a request a killed run sent,
or was about to send, whose answer never reached the journal; the provider may have generated and
billed it, so it counts at its worst case, for good. What the journal has cost is therefore
`sum(line_cost of finished lines) + sum(worst_case_usd of unsettled reservations)`
(`JournalIndex.spent_usd`), and the budget bounds that figure. A torn reservation line was never
fsynced, so its request was never sent: ignored like any torn line. A free request (worst case 0:
a local or zero-priced backend) reserves nothing and writes no reservation line.

Resume policy: a prompt is done when the journal holds, under its current request hash, an `ok`
line or a `failed` line of kind `permanent` (400/403: the same request would fail again). Failures
of kind `exhausted` (retryable causes that ran out of attempts) and `stopped` (the run stopped:
401, credits, budget) are tried again on the next run.

Table rule: per prompt, among lines with its current request hash, the last `ok` line wins, else
the last `failed` line: deterministic, and never two rows for one prompt.

Old lines: a line whose request hash is not the current one (other params, another model build;
client/request.py) is never resumed and never in the table, but it stays in the journal and its
cost counts toward the budget, which bounds the whole journal (client/budget.py).

Versioning. The journal only grows, so it is not a DVC output at all (dvc.yaml passes its path
in the command). Cached, it would store a full copy per run, O(runs x lines) for a file whose new
content is a few appended lines; as an uncached output, any checkout without it (a `dvc exp run
--queue` temp directory, a fresh clone after `dvc pull`) would make the stage stale, and the rerun
would pay for every answer again. What DVC versions is responses.parquet, built from it: every
prompt's chosen line with its text, ids, usage, cost and request hash. The journal state that
built a table is named by `journal_lines` and `journal_bytes` in metrics/generate.json (so `dvc
metrics diff` shows it move) and by `journal_sha256` in metrics/generate.details.json beside it.
It is git-ignored: it holds paid answers, to be backed up beside the DVC remote (`dvc push` does
not carry it). Without it a rerun of generate cannot resume and would pay again for what the
table already holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def encode_line(record: dict[str, Any]) -> bytes:
    """One journal line. A provider can send a lone surrogate (`"\\ud800"`, valid JSON but not
    valid UTF-8); escaping that line keeps the paid response, losslessly, instead of crashing."""
    try:
        return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n").encode()


@dataclass
class JournalScan:
    records: list[dict[str, Any]] = field(default_factory=list)   # finished lines (ok | failed)
    torn_tail: bool = False                              # last line had no newline
    bad_lines: list[int] = field(default_factory=list)   # 1-based line numbers that did not parse
    reservations: int = 0                                # reservation lines (module docstring)
    unsettled: dict[str, float] = field(default_factory=dict)   # reservation id -> worst case, unsettled

    @property
    def unsettled_usd(self) -> float:
        return sum(self.unsettled.values())


def read_journal(path: str | Path) -> JournalScan:
    scan = JournalScan()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return scan
    *lines, tail = data.split(b"\n")
    for n, line in enumerate(lines, start=1):
        rec = _parse(line) if line else None
        if rec is not None:
            scan_line(scan, rec)
        elif line:
            scan.bad_lines.append(n)   # e.g. a torn fragment of an earlier crash, terminated since
    if tail:
        rec = _parse(tail)   # a torn tail that parses lost only its newline: a whole record
        if rec is not None:
            scan_line(scan, rec)
        else:
            scan.torn_tail = True
    return scan


def scan_line(scan: JournalScan, rec: dict[str, Any]) -> None:
    if rec["status"] == "reserved":
        scan.reservations += 1
        scan.unsettled[rec["reservation"]] = float(rec["worst_case_usd"])
        return
    scan.records.append(rec)
    settle(scan.unsettled, rec)


def settle(unsettled: dict[str, float], rec: dict[str, Any]) -> None:
    """A finished line settles the reservations it lists (module docstring)."""
    for rid in rec.get("reservations") or ():
        unsettled.pop(rid, None)


def _parse(line: bytes) -> dict[str, Any] | None:
    """A finished line (status ok | failed) or a reservation line; None for anything else."""
    rec = loads(line)
    if not isinstance(rec, dict) or not isinstance(rec.get("prompt_id"), str):
        return None
    status = rec.get("status")
    if status in ("ok", "failed"):
        return rec
    if status == "reserved" and isinstance(rec.get("reservation"), str) and _amount(rec.get("worst_case_usd")):
        return rec
    return None


def _amount(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0


def loads(line: bytes) -> Any:
    """One JSON line, or None. orjson (a dependency of GX and DVC) parses ~3x faster than json;
    it refuses what json accepts on lines such as escaped lone surrogates (encode_line), which
    json then reads. The values are the same either way."""
    return loads_clean(line)[0]


def loads_clean(line: bytes) -> tuple[Any, bool]:
    """(value or None, whether every string in it is known to be valid UTF-8): orjson refuses
    lone surrogates, so what it parsed holds none; json's output may."""
    try:
        return _orjson_loads(line), _ORJSON
    except ValueError:      # orjson.JSONDecodeError subclasses ValueError
        pass
    try:
        return json.loads(line), False
    except ValueError:
        return None, False


try:
    from orjson import loads as _orjson_loads
    _ORJSON = True
except ImportError:   # pragma: no cover  (installed with great_expectations and dvc)
    _orjson_loads, _ORJSON = json.loads, False


def latest(records: list[dict[str, Any]], hashes: dict[str, str]) -> dict[str, dict[str, Any]]:
    """prompt_id -> the line that represents it (last ok, else last failed), current hash only."""
    ok: dict[str, dict[str, Any]] = {}
    failed: dict[str, dict[str, Any]] = {}
    for rec in records:
        pid = rec["prompt_id"]
        if hashes.get(pid) != rec.get("request_hash"):
            continue
        (ok if rec["status"] == "ok" else failed)[pid] = rec
    return {**failed, **ok}


class JournalIndex:
    """Where each prompt's lines are, without holding them: ~40 bytes a line, for resume and for
    building the table in bounded memory (a million-line journal: ~40 MB, not its gigabytes).

    One streaming pass parses every line once and keeps, per line, 64-bit digests of its prompt id
    and request hash, its status, whether it is done (the resume rule above), and its byte range.
    The table rule (last ok, else last failed, current hash only) is applied once, to every
    (prompt, request hash) pair at the end of the scan, so a lookup is a binary search, and
    `lookup` answers a whole batch of prompts in numpy. `read` parses the chosen line from the file.
    """

    COLUMNS = (("key", "Q"), ("hash", "Q"), ("ok", "b"), ("done", "b"), ("off", "q"), ("len", "q"), ("cost", "d"))

    def __init__(self) -> None:
        from array import array

        self.spent_usd = 0.0          # finished lines' costs + unsettled reservations at worst case
        self.unsettled: dict[str, float] = {}   # reservation id -> worst case (module docstring)
        self._complete_unsettled: dict[str, float] | None = None   # as of the last complete line
        self.torn_tail = False
        self.bad_lines: list[int] = []
        self.records = 0
        # The complete lines read: their bytes, count and sha256 (stages/generate.py's metrics
        # reuse it when nothing was appended since).
        self.complete_bytes, self.complete_lines, self.complete_sha256 = 0, 0, hashlib.sha256().hexdigest()
        self._cols = {name: array(code) for name, code in self.COLUMNS}

    @classmethod
    def scan(cls, path: str | Path, cost: Any = None, cache: str | Path | None = None) -> JournalIndex:
        """`cost(record) -> float`: what a line cost (budget.line_cost), summed into spent_usd.
        `cache`: a file that keeps the scan of the journal's complete lines. The journal only
        grows, so a cache whose bytes are still the journal's first bytes (sha256) is extended by
        reading only the lines appended since; anything else is rescanned and the cache rewritten."""
        idx = cls()
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return idx._sorted()
        with f:
            code = _derivation(cost) if cache else ""
            digest = idx._load_cache(f, cache, code) if cache else hashlib.sha256()
            f.seek(idx.complete_bytes)
            off, first = idx.complete_bytes, idx.complete_bytes
            for n, line in enumerate(f, start=idx.complete_lines + 1):
                whole = line.endswith(b"\n")
                body = line[:-1] if whole else line
                rec = _parse(body) if body else None
                if rec is not None and not whole:
                    idx._complete_unsettled = dict(idx.unsettled)   # the cache keeps complete lines only
                if rec is not None and rec["status"] == "reserved":
                    idx.unsettled[rec["reservation"]] = float(rec["worst_case_usd"])
                elif rec is not None:
                    idx._add(rec, off, len(body), cost(rec) if cost is not None else 0.0)
                    settle(idx.unsettled, rec)
                elif body and whole:
                    idx.bad_lines.append(n)   # a torn fragment of an earlier crash, terminated since
                elif body:
                    idx.torn_tail = True      # a torn tail that parses lost only its newline: a record
                off += len(line)
                if whole:
                    digest.update(line)
                    idx.complete_bytes, idx.complete_lines = off, n
            idx.complete_sha256 = digest.hexdigest()
        if cache and idx.complete_bytes > first:
            idx._save_cache(cache, code)
        idx.spent_usd = float(sum(idx._cols["cost"])) + idx.unsettled_usd
        return idx._sorted()

    @property
    def unsettled_usd(self) -> float:
        return float(sum(self.unsettled.values()))

    def _load_cache(self, f: Any, cache: str | Path, code: str) -> Any:
        """Take the cached scan when it is of this journal's first bytes and was derived by this
        code (`_derivation`); return the running sha256."""
        import numpy as np

        digest = hashlib.sha256()
        try:
            with np.load(cache, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                cols = {name: z[name] for name, _ in self.COLUMNS}
                bad = z["bad_lines"].tolist()
                unsettled = {str(k): float(v) for k, v in meta["unsettled"].items()}
        except (OSError, ValueError, KeyError, AttributeError):
            return digest
        size = meta.get("bytes", -1)
        if meta.get("code") != code or not 0 < size <= os.fstat(f.fileno()).st_size:
            return digest
        left = size
        while left:
            block = f.read(min(left, 1 << 20))
            digest.update(block)
            left -= len(block)
        if digest.hexdigest() != meta.get("sha256"):
            return hashlib.sha256()   # not a prefix of this journal: rescan it all
        for name, _ in self.COLUMNS:
            self._cols[name].frombytes(cols[name].tobytes())
        self.bad_lines, self.records = bad, len(self._cols["key"])
        self.complete_bytes, self.complete_lines = size, meta["lines"]
        self.unsettled = unsettled
        return digest

    def _save_cache(self, cache: str | Path, code: str) -> None:
        import numpy as np

        from draftgate.io import atomic_path

        unsettled = self.unsettled if self._complete_unsettled is None else self._complete_unsettled
        meta = {"bytes": self.complete_bytes, "lines": self.complete_lines, "sha256": self.complete_sha256,
                "code": code, "unsettled": unsettled}
        # Only the complete lines: a tail without its newline is read again next time (a record
        # then, or a bad line once terminated). Offsets grow with the lines.
        n = int(np.searchsorted(np.frombuffer(self._cols["off"], dtype=np.int64), self.complete_bytes))
        cols = {name: np.frombuffer(self._cols[name], dtype=np.dtype(code))[:n] for name, code in self.COLUMNS}
        with atomic_path(cache) as tmp, open(tmp, "wb") as out:
            np.savez(out, meta=np.array(json.dumps(meta)), bad_lines=np.array(self.bad_lines, dtype=np.int64), **cols)

    def _add(self, rec: dict[str, Any], off: int, length: int, cost: float) -> None:
        c = self._cols
        c["key"].append(digest64(rec["prompt_id"]))
        c["hash"].append(hash64(rec.get("request_hash") or ""))
        c["ok"].append(rec["status"] == "ok")
        c["done"].append(is_done(rec))
        c["off"].append(off)
        c["len"].append(length)
        c["cost"].append(cost)
        self.records += 1

    def _sorted(self) -> JournalIndex:
        """Keep one line per (prompt, request hash): the chosen one; sorted for binary search."""
        import numpy as np

        dtypes = {"Q": np.uint64, "b": np.int8, "q": np.int64, "d": np.float64}
        cols = {k: np.frombuffer(v, dtype=dtypes[v.typecode]).copy() if len(v) else
                np.zeros(0, dtype=dtypes[v.typecode]) for k, v in self._cols.items()}
        # Lines by pair, then ok after failed, then line order: the last of each pair is the chosen one.
        order = np.lexsort((np.arange(len(cols["key"])), cols["ok"], cols["hash"], cols["key"]))
        cols = {k: v[order] for k, v in cols.items()}
        key, h = cols["key"], cols["hash"]
        last = np.ones(len(key), dtype=bool)
        if len(key):
            last[:-1] = (key[1:] != key[:-1]) | (h[1:] != h[:-1])
        self._cols = {k: v[last] for k, v in cols.items()}
        return self

    def lookup(self, keys: Any, hashes: Any) -> Any:
        """For each (digest64(prompt_id), hash64(request_hash)) pair: the position of its chosen
        line (for `where`, `is_done`), or -1 when the journal has no line for it."""
        import numpy as np

        keys = np.asarray(keys, dtype=np.uint64)
        hashes = np.asarray(hashes, dtype=np.uint64)
        c = self._cols
        found = np.full(len(keys), -1, dtype=np.int64)
        if not len(c["key"]) or not len(keys):
            return found
        lo = np.searchsorted(c["key"], keys, "left")
        hi = np.searchsorted(c["key"], keys, "right")
        one = hi - lo == 1            # the usual case: one request hash per prompt in the journal
        at = np.minimum(lo, len(c["key"]) - 1)
        hit = one & (c["hash"][at] == hashes)
        found[hit] = lo[hit]
        for j in np.nonzero(hi - lo > 1)[0]:   # old hashes too (params changed): a short search
            i = int(lo[j]) + int(np.searchsorted(c["hash"][lo[j]:hi[j]], hashes[j]))
            if i < hi[j] and c["hash"][i] == hashes[j]:
                found[j] = i
        return found

    def where(self, positions: Any) -> list[tuple[int, int] | None]:
        """(offset, length) of each looked-up line, None where there is none."""
        off, length = self._cols["off"], self._cols["len"]
        return [None if i < 0 else (int(off[i]), int(length[i])) for i in positions.tolist()]

    def spans(self, positions: Any) -> tuple[Any, Any]:
        """(offsets, lengths) of each looked-up line, as numpy arrays; -1 where there is none."""
        import numpy as np

        has = positions >= 0
        off = np.full(len(positions), -1, dtype=np.int64)
        length = np.zeros(len(positions), dtype=np.int64)
        off[has] = self._cols["off"][positions[has]]
        length[has] = self._cols["len"][positions[has]]
        return off, length

    def is_done(self, positions: Any) -> Any:
        """Per looked-up line: done by the resume rule (module docstring)."""
        import numpy as np

        done = np.zeros(len(positions), dtype=bool)
        has = positions >= 0
        done[has] = self._cols["done"][positions[has]] != 0
        return done

    def _line(self, prompt_id: str, request_hash: str) -> int:
        return int(self.lookup([digest64(prompt_id)], [hash64(request_hash)])[0])

    def chosen(self, prompt_id: str, request_hash: str) -> tuple[int, int] | None:
        """(offset, length) of the line that represents the prompt, or None."""
        i = self._line(prompt_id, request_hash)
        return None if i < 0 else (int(self._cols["off"][i]), int(self._cols["len"][i]))

    def done(self, prompt_id: str, request_hash: str) -> bool:
        i = self._line(prompt_id, request_hash)
        return i >= 0 and bool(self._cols["done"][i])

    @staticmethod
    def read(f: Any, where: tuple[int, int]) -> dict[str, Any]:
        return JournalIndex.read_clean(f, where)[0]

    @staticmethod
    def read_clean(f: Any, where: tuple[int, int]) -> tuple[dict[str, Any], bool]:
        """The line and whether its text is known to be valid UTF-8 (loads_clean)."""
        f.seek(where[0])
        raw = f.read(where[1])
        rec, clean = loads_clean(raw)
        return (rec, clean) if rec is not None else (json.loads(raw), False)   # json's own error


def _derivation(cost: Any) -> str:
    """What derives a scan's columns from the lines: this module (parsing, digests, the resume
    rule) and the cost function's module. An edit to either makes a cached scan stale."""
    import inspect

    h = hashlib.sha256(Path(__file__).read_bytes())
    source = inspect.getsourcefile(cost) if cost is not None else None
    h.update(Path(source).read_bytes() if source else b"no cost")
    return h.hexdigest()


def index_path(journal: str | Path) -> Path:
    """Where the generate stage keeps the journal's scan (JournalIndex.scan's `cache`)."""
    return Path(f"{journal}.index")


def digest64(text: str) -> int:
    # 64 bits of blake2b: an index key, always confirmed by the request hash's own 64 bits.
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def hash64(request_hash: str) -> int:
    """64 bits of a request hash (a sha256 in hex: its first 16 digits; anything else, digested)."""
    if len(request_hash) == 64:
        try:
            return int(request_hash[:16], 16)
        except ValueError:
            pass
    return digest64(request_hash)


def hash64_array(hash_bytes: bytes) -> Any:
    """hash64 of request hashes given as 32 raw bytes each (run.RunResult.hash_bytes), in numpy."""
    import numpy as np

    return np.frombuffer(hash_bytes, dtype=">u8").reshape(-1, 4)[:, 0].astype(np.uint64)


def is_done(rec: dict[str, Any]) -> bool:
    return rec["status"] == "ok" or rec.get("failure_kind") == "permanent"


class Journal:
    """Append-only, group-committed, fsynced. Use as `async with Journal(path) as j`.

    `secrets`: no line is written with one in it. The client cuts them out where they arrive
    (redact.py); a line that still holds one (a field that path missed) is redacted here, every
    field, and counted in `redacted_lines`."""

    def __init__(self, path: str | Path, secrets: tuple[str, ...] = ()):
        from draftgate.client.redact import line_needles

        self.path = Path(path)
        self.secrets = tuple(s for s in secrets if s)
        self._needles = line_needles(self.secrets)
        self.redacted_lines = 0
        self._fd: int | None = None
        self._pending: list[tuple[bytes, asyncio.Future]] = []
        self._writer: asyncio.Task | None = None
        self.lines = 0
        self.commits = 0

    async def __aenter__(self) -> "Journal":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)   # mode per umask
        size = os.fstat(self._fd).st_size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    _write_all(self._fd, b"\n")   # isolate the torn fragment; read_journal counts it
                    os.fsync(self._fd)
        return self

    async def __aexit__(self, *exc: object) -> None:
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def append(self, record: dict[str, Any]) -> None:
        line = encode_line(record)
        if self._needles and any(n in line for n in self._needles):
            line = self._redacted(record)
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((line, fut))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._commit_loop())
        await fut

    async def _commit_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                # In a thread: the event loop keeps serving sockets while the disk syncs, and what
                # finishes meanwhile joins the next commit.
                await loop.run_in_executor(None, self._commit, b"".join(line for line, _ in batch))
            except Exception as e:   # every waiter must hear of it, or its worker waits forever
                err = OSError(f"{self.path}: journal write failed ({type(e).__name__}: {e}); fix the cause "
                              "(disk full? permissions?) and rerun: finished lines are kept, the rest is retried")
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(err)
                continue
            self.lines += len(batch)
            self.commits += 1
            for _, fut in batch:
                if not fut.done():
                    fut.set_result(None)

    def _redacted(self, record: dict[str, Any]) -> bytes:
        from draftgate.client.redact import REDACTED, redact_record

        self.redacted_lines += 1
        line = encode_line(redact_record(record, self.secrets))
        for n in self._needles:   # what is left can only be an escape redact() cannot see
            line = line.replace(n, REDACTED.encode())
        return line

    def _commit(self, data: bytes) -> None:
        assert self._fd is not None, "Journal used outside `async with`"
        _write_all(self._fd, data)
        os.fsync(self._fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
