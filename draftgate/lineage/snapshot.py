"""One revision of the repository, read without checking it out: the workspace, a commit, or a DVC
experiment.

DVC stores each experiment as a git commit under `refs/exps/<baseline[:2]>/<baseline[2:]>/<name>`
(docs/lineage.md), holding its params.yaml, dvc.lock and the metric files (`cache: false`, so in git).
So one reader serves commits and experiments: `git cat-file --batch` (one process for every file of
every revision). What DVC caches instead of git (data/contract/contract.json, a hidden-state
manifest) is read from the DVC cache by the md5 that revision's dvc.lock records, when the cache
still holds it; the workspace is read from disk.
"""

from __future__ import annotations

import configparser
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKSPACE = "workspace"


class RevisionError(ValueError):
    """A name that is neither `workspace`, a git revision nor an experiment."""


def git(root: Path, *args: str, check: bool = True) -> str:
    out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RevisionError(f"git {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


class GitReader:
    """Blobs by `REV:path` through one `git cat-file --batch` process."""

    def __init__(self, root: Path):
        self.root = root
        self._proc: subprocess.Popen | None = None

    def read(self, rev: str, path: str) -> bytes | None:
        if self._proc is None:
            self._proc = subprocess.Popen(["git", "cat-file", "--batch"], cwd=self.root, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self._proc.stdin and self._proc.stdout
        self._proc.stdin.write(f"{rev}:{path}\n".encode())
        self._proc.stdin.flush()
        header = self._proc.stdout.readline().decode().split()
        if len(header) != 3:        # "<name> missing" or "ambiguous"
            return None
        size = int(header[2])
        data = self._proc.stdout.read(size)
        self._proc.stdout.read(1)   # the newline after every object
        return data if header[1] == "blob" else None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            self._proc.wait()
            self._proc = None


def cache_dir(root: Path) -> Path:
    """The DVC cache: `cache.dir` from .dvc/config.local or .dvc/config (relative to .dvc/), else .dvc/cache."""
    for name in ("config.local", "config"):
        path = root / ".dvc" / name
        if not path.is_file():
            continue
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except configparser.Error:
            continue
        if parser.has_option("cache", "dir"):
            return (root / ".dvc" / parser.get("cache", "dir")).resolve()
    return root / ".dvc" / "cache"


@dataclass
class Snapshot:
    root: Path
    kind: str                 # workspace | commit | experiment | failed (an experiment that saved nothing)
    rev: str | None           # full sha; None for the workspace
    name: str                 # what a user types: workspace, a short sha, an experiment's name
    baseline: str | None = None      # an experiment's parent commit
    timestamp: int | None = None     # commit time (unix seconds)
    subject: str = ""
    reader: GitReader | None = field(default=None, repr=False, compare=False)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def label(self) -> str:
        return self.name if self.kind != "commit" else self.rev[:8]  # type: ignore[index]

    def git_bytes(self, path: str) -> bytes | None:
        if self.kind == "failed":       # a failed experiment left no files anywhere
            return None
        if self.rev is None:
            p = self.root / path
            return p.read_bytes() if p.is_file() else None
        if self.reader is None:
            self.reader = GitReader(self.root)
        return self.reader.read(self.rev, path)

    def read(self, path: str, md5: str | None = None, inner: str | None = None) -> bytes | None:
        """The file at this revision: from git (or disk), else from the DVC cache by `md5`, the hash
        this revision's dvc.lock gives the file (or the folder holding it, with `inner` the file's
        path inside that folder)."""
        data = self.git_bytes(path)
        if data is None and md5:
            data = read_cache(self.root, md5, inner)
        return data

    def json(self, path: str, md5: str | None = None, inner: str | None = None) -> Any:
        key = ("json", path, md5, inner)
        if key not in self._memo:
            data = self.read(path, md5, inner)
            try:
                self._memo[key] = json.loads(data) if data is not None else None
            except ValueError:
                self._memo[key] = None
        return self._memo[key]

    def yaml(self, path: str) -> Any:
        key = ("yaml", path)
        if key not in self._memo:
            from draftgate.config import read_yaml

            data = self.git_bytes(path)
            self._memo[key] = read_yaml(data) if data is not None else None    # as DVC wrote it
        return self._memo[key]


def read_cache(root: Path, md5: str, inner: str | None = None) -> bytes | None:
    """An object of DVC 3's cache (files/md5/ab/cdef...). A `.dir` md5 is a folder: its object lists
    {md5, relpath} of every file, and `inner` picks one."""
    obj = cache_dir(root) / "files" / "md5" / md5[:2] / md5[2:]
    if not md5.endswith(".dir"):
        return obj.read_bytes() if obj.is_file() else None
    entry = next((e for e in dir_listing(root, md5) or [] if e.get("relpath") == inner), None)
    return read_cache(root, entry["md5"]) if entry else None


def dir_listing(root: Path, md5: str) -> list[dict] | None:
    """A cached folder's files: [{md5, relpath}, ...], or None when the cache lacks it."""
    obj = cache_dir(root) / "files" / "md5" / md5[:2] / md5[2:]
    if not md5.endswith(".dir") or not obj.is_file():
        return None
    try:
        return json.loads(obj.read_bytes())
    except ValueError:
        return None


# ------------------------------------------------------------ naming revisions

def repo_root(start: str | Path = ".") -> Path:
    out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=start, capture_output=True, text=True)
    if out.returncode != 0:
        raise RevisionError(f"{Path(start).resolve()}: not inside a git repository (run from the project's root)")
    return Path(out.stdout.strip())


def experiments(root: Path) -> list[tuple[str, str, str]]:
    """(name, sha, baseline sha) of every saved experiment, from refs/exps (DVC's own store; `dvc
    exp show --json` reads the same refs). refs/exps/exec/* are DVC's scratch refs, not experiments."""
    out = git(root, "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps/", check=False)
    found = []
    for line in out.splitlines():
        ref, sha = line.split()
        parts = ref.split("/")
        if len(parts) == 5 and parts[2] != "exec":
            found.append((parts[4], sha, parts[2] + parts[3]))
    return found


def failed_experiments(root: Path) -> list[tuple[str, str]]:
    """(name, error) of experiments `dvc exp show --json` lists as failed: a queued run that stopped
    (a failed gate, a crash) leaves no commit under refs/exps, only this entry and `dvc queue logs`.
    Best effort: no dvc, or dvc failing, gives none (the saved experiments come from git anyway)."""
    import shutil
    import sys

    dvc = shutil.which("dvc") or str(Path(sys.executable).parent / "dvc")
    try:
        out = subprocess.run([dvc, "exp", "show", "--json", "--all-branches"], cwd=root, capture_output=True,
                             text=True, timeout=120)
        baselines = json.loads(out.stdout) if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
    failed = []
    for base in baselines:
        for exp in base.get("experiments") or []:
            for rev in exp.get("revs") or []:
                err = rev.get("error")
                if err:
                    failed.append((rev.get("name") or exp.get("name") or rev["rev"][:8],
                                   err.get("msg", "failed") if isinstance(err, dict) else str(err)))
    return failed


def _commit_info(root: Path, rev: str) -> tuple[int, str]:
    out = git(root, "show", "-s", "--format=%ct%x1f%s", rev)
    stamp, _, subject = out.strip().partition("\x1f")
    return int(stamp), subject


def open_revision(root: Path, name: str, reader: GitReader | None = None) -> Snapshot:
    """`workspace`, an experiment's name, or anything `git rev-parse` takes (HEAD~1, a sha, a branch)."""
    if name == WORKSPACE:
        return Snapshot(root, WORKSPACE, None, WORKSPACE, baseline=_head(root))
    for exp, sha, base in experiments(root):
        if exp == name:
            stamp, subject = _commit_info(root, sha)
            return Snapshot(root, "experiment", sha, exp, baseline=base, timestamp=stamp, subject=subject,
                            reader=reader)
    out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], cwd=root,
                         capture_output=True, text=True)
    if out.returncode != 0:
        known = ", ".join(e for e, _, _ in experiments(root)[:10]) or "none"
        raise RevisionError(f"{name!r}: not `workspace`, a git revision, nor an experiment "
                            f"(experiments: {known}; `dvc exp list --all-commits` lists them)")
    sha = out.stdout.strip()
    stamp, subject = _commit_info(root, sha)
    return Snapshot(root, "commit", sha, sha[:8], timestamp=stamp, subject=subject, reader=reader)


def _head(root: Path) -> str | None:
    out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() or None


def history(root: Path, with_experiments: bool = True, with_workspace: bool = True,
            with_failed: bool = False) -> list[Snapshot]:
    """Every revision worth a row: each commit on HEAD's history or a branch that changed dvc.lock
    (oldest first), each saved experiment, each failed one (`with_failed`: asks `dvc exp show`),
    and the workspace (what `dvc repro` left on disk now)."""
    reader = GitReader(root)
    log = git(root, "log", "--format=%H%x1f%ct%x1f%s", "HEAD", "--branches", "--", "dvc.lock", check=False)
    snaps = []
    for line in reversed(log.splitlines()):
        sha, stamp, subject = line.split("\x1f", 2)
        snaps.append(Snapshot(root, "commit", sha, sha[:8], timestamp=int(stamp), subject=subject, reader=reader))
    if with_experiments:
        exps = []
        for name, sha, base in experiments(root):
            stamp, subject = _commit_info(root, sha)
            exps.append(Snapshot(root, "experiment", sha, name, baseline=base, timestamp=stamp, subject=subject,
                                 reader=reader))
        snaps += sorted(exps, key=lambda s: (s.timestamp or 0, s.name))
    if with_failed:
        saved = {s.name for s in snaps}
        snaps += [Snapshot(root, "failed", None, name, subject=error) for name, error in failed_experiments(root)
                  if name not in saved]
    if with_workspace and (root / "dvc.lock").is_file():
        snaps.append(Snapshot(root, WORKSPACE, None, WORKSPACE, baseline=_head(root)))
    return snaps
