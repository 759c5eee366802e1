"""`draftgate audit`: every commit and experiment as rows of DuckDB tables; `--diff A B` says what changed.

    draftgate audit                          # summary of every revision; writes .cache/audit.duckdb
    draftgate audit --format md              # the same as a Markdown table (csv: every column, full hashes)
    draftgate audit --diff HEAD~1 HEAD       # params, artifacts, code, fingerprints, figures, verdicts
    draftgate audit --diff exp-a exp-b --format csv
    duckdb .cache/audit.duckdb "select * from summary"

Revisions: each commit of HEAD's history (and branches) that changed dvc.lock, each experiment DVC
saved (refs/exps; what `dvc exp show --json` lists), and the workspace. Each is read from git as it
was committed (snapshot.py), so the audit needs no checkout and no `dvc` process. The tables and
the queries users need are in docs/lineage.md. This module is the command; collect.py reads a
revision, db.py writes the tables, diff.py compares two, render.py prints rows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftgate.lineage.collect import Revision, collect, collect_all
from draftgate.lineage.db import TABLES, summary, write_db
from draftgate.lineage.diff import diff
from draftgate.lineage.render import COMPACT, render
from draftgate.lineage.snapshot import RevisionError, open_revision, repo_root

# Not reports/audit.duckdb: that one is the report stage's DVC output, and rewriting it here would
# leave `dvc status` dirty after a command that only reads (.cache/ is git-ignored scratch).
DEFAULT_DB = ".cache/audit.duckdb"


def build(root: str | Path = ".", db: str | Path | None = DEFAULT_DB, with_experiments: bool = True,
          with_failed: bool = False) -> list[Revision]:
    root = repo_root(root)
    if db:
        refuse_dvc_output(root, db)
    revs = collect_all(root, with_experiments, with_failed)
    if db:
        write_db(revs, root / db if not Path(db).is_absolute() else db)
    return revs


def refuse_dvc_output(root: Path, db: str | Path) -> None:
    """An audit only reads: writing a stage's output would make `dvc status` report it modified."""
    from draftgate.lineage.pipeline import Pipeline
    from draftgate.lineage.snapshot import WORKSPACE

    path = Path(db).resolve() if Path(db).is_absolute() else (root / db).resolve()
    try:
        rel = path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return      # outside the repository: no stage writes there
    found = Pipeline.at(open_revision(root, WORKSPACE)).producer(rel)
    if found:
        raise RevisionError(f"--db {db}: stage {found[0].name!r} writes {found[1].path} (a DVC output), and the audit "
                            f"rewriting it would leave `dvc status` dirty; write elsewhere (default: {DEFAULT_DB})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="draftgate audit",
                                 description="Every commit and experiment as DuckDB tables; --diff A B says what changed.")
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"),
                    help="compare two revisions: workspace, a git revision (HEAD~1, a sha) or an experiment's name")
    ap.add_argument("--format", choices=("table", "csv", "md"), default="table")
    ap.add_argument("--db", default=DEFAULT_DB, help=f"the DuckDB file to (re)write (default: {DEFAULT_DB}); "
                                                     "'' for none")
    ap.add_argument("--wide", action="store_true", help="every summary column (csv always has them all)")
    ap.add_argument("--no-exp", action="store_true", help="commits and the workspace only, no experiments")
    ap.add_argument("--no-dvc", action="store_true",
                    help="read git only: no `dvc exp show` for failed experiments (saved ones come from git)")
    ap.add_argument("--repo", default=".", help="the project's root (default: the current directory's repository)")
    args = ap.parse_args(argv)
    try:
        root = repo_root(args.repo)
        if args.diff:
            a, b = (collect(open_revision(root, name)) for name in args.diff)
            missing = [n for n, r in zip(args.diff, (a, b)) if r is None]
            if missing:
                raise RevisionError(f"{', '.join(missing)}: no dvc.yaml stages there")
            rows = diff(a, b)  # type: ignore[arg-type]
            sys.stdout.write(render(rows, args.format, ["section", "key", "a", "b"]) if rows else
                             f"no difference between {args.diff[0]} and {args.diff[1]}\n")
            return 0
        revs = build(root, args.db or None, not args.no_exp, with_failed=not (args.no_exp or args.no_dvc))
    except RevisionError as e:
        print(f"draftgate audit: {e}", file=sys.stderr)
        return 2
    rows = summary(revs)
    cols = None if args.wide or args.format == "csv" else [c for c in COMPACT if rows and c in rows[0]]
    sys.stdout.write(render(rows, args.format, cols))
    if args.db:
        print(f"wrote {args.db} (tables: summary, {', '.join(TABLES)})", file=sys.stderr)
    return 0
