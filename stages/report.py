"""DVC stage `report`: reports/index.html, one static page readable offline (docs/lineage.md).

python -m stages.report --out reports/index.html --db reports/audit.duckdb

The page the `draftgate report` command refreshes by hand (draftgate/lineage/report.py): the Data
Docs site rebuilt from the gates' records (every gate with a data/gates/<suite>.details.json has its
page, whether it reran or not), each gate's verdict beside its page, every plot as inline SVG, the
audit, the final artifacts' lineage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.report", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="the page")
    p.add_argument("--db", type=Path, help="write the audit tables here (and its CSV beside it), linked from the page")
    p.add_argument("--no-exp", action="store_true", help="commits and the workspace only, no experiments")
    p.add_argument("--repo", default=".", help="the project's root")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.io import write_text
    from draftgate.lineage.report import build_page, rebuild_data_docs, repo_root
    from draftgate.lineage.snapshot import RevisionError

    try:
        root = repo_root(args.repo)
        out = args.out if args.out.is_absolute() else root / args.out
        db = None if args.db is None else args.db if args.db.is_absolute() else root / args.db
        page = build_page(root, out, not args.no_exp, db, rebuild_data_docs(root))
    except RevisionError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    write_text(out, page)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
