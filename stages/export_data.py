"""Stage `export_data`: the gated training rows -> SpecForge's and speculators' offline layouts.

python -m stages.export_data --params params.yaml --hidden data/hidden --tokens data/repair/tokens.parquet \
    --gate data/gates/hidden.json --out data/export [--formats specforge,speculators] [--metrics FILE]

Refuses to run unless the hidden gate passed (the rows are the ones it judged). The layouts and how
each library's own loader reads them: draftgate/exchange/export.py, docs/interop.md ("Gated data out").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

FORMATS = ("specforge", "speculators")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.export_data",
                                description="gated hidden states + tokens -> SpecForge / speculators offline training data")
    p.add_argument("--params", required=True, type=Path, help="params.yaml: hidden (the target), drafter (splits, draft vocab)")
    p.add_argument("--hidden", required=True, type=Path, help="the hidden stage's folder (manifest.json)")
    p.add_argument("--tokens", required=True, type=Path, help="tokens.parquet the features were made from")
    p.add_argument("--gate", required=True, type=Path, help="the hidden gate's result JSON (must have passed)")
    p.add_argument("--out", required=True, type=Path, help="output folder (specforge/, speculators/, export.json)")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of: " + ", ".join(FORMATS))
    p.add_argument("--metrics", type=Path, help="write the export's figures here (JSON)")
    args = p.parse_args(argv)
    args.formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    bad = sorted(set(args.formats) - set(FORMATS))
    if bad or not args.formats:
        p.error(f"--formats {','.join(args.formats)!r}: unknown {bad[0]!r}; choose from {', '.join(FORMATS)}"
                if bad else "--formats is empty")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.gates.result import GateNotPassed, require_passed
    from draftgate.exchange.export import ExportError, export_data
    from draftgate.target import TargetError
    from draftgate.io import write_json

    try:
        require_passed(args.gate, "gate_hidden", "fix the hidden-state features before exporting them")
        params = load_params(args.params)
        stats = export_data(args.hidden, args.tokens, args.out, params, formats=args.formats)
    except (ParamsError, GateNotPassed, ExportError, TargetError, OSError) as e:
        print(f"export_data: {e}", file=sys.stderr)
        return 1
    if args.metrics:
        write_json(args.metrics, stats)
    print(f"export_data: {stats['rows']} rows, {stats['tokens']:,} tokens as {', '.join(stats['formats'])} under "
          f"{args.out} (draft vocabulary {stats['draft_vocab']['size']}, map {stats['draft_vocab']['map_sha256'][:12]}; "
          f"{stats['dropped']['split_not_trained']} rows outside drafter.splits left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
