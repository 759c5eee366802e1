"""The one cache for what draftgate builds from package files: converted tokenizers and models.

Policy (every entry, whatever it holds):
- Where: `$DRAFTGATE_CACHE`, else `~/.cache/draftgate`; never inside the repository.
- Key: the content hash of every input of the build: the source files' sha256, the recipe (the
  build functions' own source code, so a fix to a conversion rebuilds without anyone bumping a
  version), and the library versions that do the work. An entry is the folder `<name>-<key[:16]>`.
- Publish: the build fills a temp folder beside the entry; `manifest.json` (the sha256 of every
  file, the key and what the build recorded about its inputs) is written last; the folder is
  renamed into place whole. A concurrent twin that published first is kept.
- Trust: an entry is used only when its manifest lists exactly the files present and every hash
  matches, re-checked on each load. An incomplete or altered entry is rebuilt, never trusted because
  it exists. A file is read and hashed again only when its stat (size, mtime, ctime, inode) differs
  from the one stamped when its hash last matched (`.verified.json` in the entry, as git's index
  does): any write to a file moves its ctime, which no user process can set back. Hashing
  SmolLM2's 538 MB of weights on every load had cost ~0.5 s a process, ~5% of `make test`'s CPU.
- Identity: `Entry.fingerprint`, the hash of the manifest's file table, names the exact bytes
  served; the local server reports it, and the generate stage puts it in each request hash.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from draftgate.io import file_sha256 as _read_sha256
from draftgate.io import new_temp_dir, write_json

CACHE_ENV = "DRAFTGATE_CACHE"
MANIFEST = "manifest.json"
STAMP = ".verified.json"     # not the entry's content: the stats its hashes were last verified at
# A file changed within the same clock tick as its stamp could keep its ctime: files younger than
# this are hashed and not stamped (git's "racy" rule).
RACY_S = 2.0


@dataclass(frozen=True)
class Entry:
    path: Path
    fingerprint: str          # sha256 over the manifest's {file: sha256} table
    built: bool               # True when this call built it (the cold path)
    inputs: dict[str, Any]    # what the build recorded about its inputs (source hashes, versions)


def root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "draftgate")


def key(*parts: str | bytes) -> str:
    """sha256 over length-prefixed parts: ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.sha256()
    for p in parts:
        b = p if isinstance(p, bytes) else p.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def recipe(module: str, *functions: str) -> str:
    """The source text of the named top-level functions of `module` (read from its file, so a
    monkeypatched attribute cannot change it): the build recipe, as one string for the key."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"recipe: module {module!r} not found")
    return _recipe(spec.origin, os.stat(spec.origin).st_mtime_ns, functions)


@functools.lru_cache(maxsize=32)
def _recipe(path: str, mtime_ns: int, functions: tuple[str, ...]) -> str:
    import ast

    text = Path(path).read_text(encoding="utf-8")
    found = {node.name: ast.get_source_segment(text, node) for node in ast.parse(text).body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in functions}
    missing = [f for f in functions if f not in found]
    if missing:
        raise ValueError(f"recipe: {path} has no top-level function {', '.join(missing)}")
    return "\n".join(found[f] for f in functions)


def file_sha256(path: Path) -> str:
    stat = Path(path).stat()
    return _file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    # Memoised per (path, size, mtime) within a process: the tokenizer and the model hash the
    # same 93 MB GGUF (~0.1 s each) to key their entries.
    return _read_sha256(path)


def entry(name: str, build_key: str, build: Callable[[Path], None], *, inputs: dict[str, Any] | None = None,
          cache_root: Path | None = None) -> Entry:
    """The entry `<name>-<key[:16]>`: used when valid, else built by `build(folder)` and published."""
    path = (cache_root or root()) / f"{name}-{build_key[:16]}"
    found = _valid(path, build_key)
    if found is not None:
        return found
    if path.exists():
        print(f"draftgate: cache entry {path} is incomplete or altered; rebuilding it", file=sys.stderr)
        shutil.rmtree(path)
    tmp = new_temp_dir(path.parent, path.name)
    try:
        build(tmp)
        files = _hash_files(tmp)
        if not files:
            raise RuntimeError(f"building cache entry {path.name} wrote no files")
        write_json(tmp / MANIFEST, {"key": build_key, "files": files, "inputs": inputs or {}})
        try:
            os.rename(tmp, path)
        except OSError:
            if _valid(path, build_key) is None:   # lost a race to a complete twin: fine; else fail
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    published = _valid(path, build_key)
    if published is None:
        raise RuntimeError(f"cache entry {path} failed its own check right after publishing; "
                           f"is something else writing under {path.parent}?")
    return Entry(published.path, published.fingerprint, True, published.inputs)


def _valid(path: Path, build_key: str) -> Entry | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest["key"] != build_key or not isinstance(files, dict) or not _holds(path, files):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Entry(path, fingerprint(files), False, manifest.get("inputs") or {})


def fingerprint(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _hash_files(folder: Path) -> dict[str, str]:
    return {name: _read_sha256(p) for name, p in contents(folder).items()}


def contents(folder: Path) -> dict[str, Path]:
    """The entry's files by relative name: all but its manifest and its stamp (with the stamp's
    temp files, so another process writing one is not taken for a stray file). Code that copies an
    entry's files elsewhere reads them from here, never from a listing of the folder."""
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MANIFEST and not (p.parent == folder and p.name.startswith(STAMP))}


def _holds(folder: Path, files: dict[str, str]) -> bool:
    """The folder holds exactly `files`, each with its hash: a file whose stat is the one stamped
    with this hash is not read again; every other file is hashed, and stamped when it matches."""
    present = contents(folder)
    if set(present) != set(files):
        return False
    try:
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stamp = None
    if not isinstance(stamp, dict):     # none yet, or unreadable: every file is hashed
        stamp = {}
    now = time.time()
    fresh = {}
    for name, p in present.items():
        st = p.stat()
        seen = [files[name], st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        if stamp.get(name) != seen:
            if _read_sha256(p) != files[name]:
                return False
            if now - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 < RACY_S:
                continue
        fresh[name] = seen
    if fresh != stamp:
        try:
            write_json(folder / STAMP, fresh)
        except OSError:        # a read-only cache: verified all the same, hashed again next time
            pass
    return True
