"""DVC stage `hidden`: kept token rows -> EAGLE-3 hidden states (data/hidden), resumable.

python -m stages.hidden --params params.yaml --tokens data/repair/tokens.parquet \
    --gate data/gates/repair.json --out data/hidden --metrics metrics/hidden.json \
    [--responses data/responses/responses.parquet --prompts data/prompts/prompts.parquet] \
    [--prefill data/repair/prefill]

Scale out: `torchrun --nproc-per-node N -m stages.hidden <same arguments>` (each rank extracts
its share of the planned shards; rank 0 merges). Offline mode writes shards, index and manifest;
online mode only the index and manifest (docs/hidden-states.md); the work is draftgate/hidden/run.py's.
--prefill: the repair stage's base-pass features; rows whose ids equal its rows are copied, not
forwarded again (docs/repair.md, "One prefill for two stages").
Exit 1 on unusable input or params, or a failed extraction (a rerun resumes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.hidden", description=__doc__.splitlines()[0])
    p.add_argument("--params", required=True, type=Path)
    p.add_argument("--tokens", required=True, type=Path, help="tokens.parquet (kept rows are extracted)")
    p.add_argument("--gate", required=True, type=Path, help="the tokens gate's metric JSON")
    p.add_argument("--out", required=True, type=Path, help="output directory (shards, index, manifest)")
    p.add_argument("--metrics", required=True, type=Path)
    p.add_argument("--responses", type=Path, help="responses.parquet: prove the served weights (check_served)")
    p.add_argument("--prompts", type=Path, help="prompts.parquet, with --responses")
    p.add_argument("--prefill", type=Path, help="the repair stage's prefill directory: its rows are not forwarded again")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.device import torch_threads
    from draftgate.gates.result import GateNotPassed, require_passed
    from draftgate.hidden.run import HiddenError, HiddenRequest, run

    try:
        params = load_params(args.params)
        require_passed(args.gate, "gate_repair", "fix the repaired tokens before extracting hidden states")
        with torch_threads(params.hidden.threads):           # the shards' bytes depend on it
            metrics = run(params, HiddenRequest(tokens=args.tokens, out=args.out, responses=args.responses,
                                                prompts=args.prompts, prefill=args.prefill))
    except (ParamsError, GateNotPassed, HiddenError) as e:
        print(f"hidden: {e}", file=sys.stderr)
        return 1
    if metrics is not None:       # rank 0
        metrics.write(args.metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
