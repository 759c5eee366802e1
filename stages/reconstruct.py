"""DVC stage: API responses -> exact token ids (data/tokens/tokens.parquet), mismatch report.

Quarantined rows stay in tokens.parquet with `quarantine_reason` set (kept rows: null), so one
table holds every response and its fate; consumers select `quarantine_reason IS NULL`.
The work is draftgate/reconstruct/run.py's; this stage checks the responses gate and writes.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

# The mismatch report's billing block is the one metrics/reconstruct.json shows: in the report's
# details only, so `dvc metrics show` does not print it twice.
MISMATCH_DETAILS_ONLY = ("billing",)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.reconstruct", description=__doc__)
    p.add_argument("--params", required=True, type=Path)
    p.add_argument("--contract", required=True, type=Path, help="contract.json (special ids)")
    p.add_argument("--prompts", required=True, type=Path, help="prompts.parquet")
    p.add_argument("--responses", required=True, type=Path, help="responses.parquet")
    p.add_argument("--gate", required=True, type=Path, help="the responses gate's result JSON")
    p.add_argument("--out", required=True, type=Path, help="output directory (tokens.parquet)")
    p.add_argument("--metrics", required=True, type=Path)
    p.add_argument("--report", required=True, type=Path,
                   help="mismatch report JSON (a DVC metric, numbers only; all of it in <report>.details.json)")
    p.add_argument("--plot", required=True, type=Path, help="per-dataset mismatch CSV (dvc plots)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.gates.result import GateNotPassed, require_passed
    from draftgate.io import write_json, write_text
    from draftgate.metrics import details_path, metric
    from draftgate.reconstruct.inputs import InputError
    from draftgate.reconstruct.run import ReconstructRequest, run
    from draftgate.reconstruct.table import plot_rows
    from draftgate.templates import TemplateError
    from draftgate.tokenizers import TokenizerError

    try:
        params = load_params(args.params)
        require_passed(args.gate, "gate_responses", "fix the responses before reconstructing them")
        done = run(params, ReconstructRequest(contract=args.contract, prompts=args.prompts,
                                              responses=args.responses, out=args.out))
    except (ParamsError, GateNotPassed, InputError, TemplateError, TokenizerError) as e:
        print(f"reconstruct: {e}", file=sys.stderr)
        return 1
    done.metrics.write(args.metrics)
    # Numbers only in the metric (dvc metrics show), less the breakdowns and the billing block; the
    # whole report, text and nulls too, beside it.
    write_json(details_path(args.report), done.report)
    write_json(args.report, metric(done.report, MISMATCH_DETAILS_ONLY))
    write_text(args.plot, _csv(plot_rows(done.report)))
    return 0


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    fields = list(rows[0]) if rows else ["dataset"]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


if __name__ == "__main__":
    sys.exit(main())
