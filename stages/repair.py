"""DVC stage `repair`: the tokens table -> the same rows with each text-method row split the way
the target most likely sampled it, held to the billed length (docs/repair.md).

python -m stages.repair --params params.yaml --tokens data/tokens/tokens.parquet \
    --vocab data/contract/vocab.parquet --gate data/gates/tokens.json \
    --out data/repair/tokens.parquet --prefill data/repair/prefill --metrics metrics/repair.json

Every row comes out (repaired rows: method `repaired`, the text method's ids in `text_ids`); the
work is draftgate/repair/run.py's. --prefill: the hidden stage's features of the rows whose ids the
search kept, from the same base pass (draftgate/prefill.py; an empty one that says why where the
backends cannot share it). Exit 1 on unusable input or params, or an engine that cannot score.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.repair", description=__doc__.splitlines()[0])
    p.add_argument("--params", required=True, type=Path)
    p.add_argument("--tokens", required=True, type=Path, help="tokens.parquet (the reconstruct stage's)")
    p.add_argument("--vocab", required=True, type=Path, help="the contract's vocab.parquet (every id's bytes)")
    p.add_argument("--gate", required=True, type=Path, help="the tokens gate's metric JSON")
    p.add_argument("--out", required=True, type=Path, help="the repaired tokens.parquet")
    p.add_argument("--prefill", type=Path, help="directory for the hidden stage's prefill (omitted: none)")
    p.add_argument("--metrics", required=True, type=Path)
    p.add_argument("--responses", type=Path,
                   help="responses.parquet: grade against the backend's own ids where it returned them (metrics only)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.device import torch_threads
    from draftgate.gates.result import GateNotPassed, require_passed
    from draftgate.io import write_parquet
    from draftgate.repair.run import RepairError, opened, run

    try:
        params = load_params(args.params)
        require_passed(args.gate, "gate_tokens", "fix the tokens before repairing them")
        started = time.perf_counter()
        with opened(params, args.tokens, args.vocab, args.responses, args.prefill) as request, \
                torch_threads(params.repair.threads if params.repair.backend == "hf" else None):
            result = run(dataclasses.replace(request, progress=_progress(started)))
    except (ParamsError, GateNotPassed, RepairError) as e:
        print(f"repair: {e}", file=sys.stderr)
        return 1
    result.metrics.figures["elapsed_s"] = round(time.perf_counter() - started, 3)
    write_parquet(args.out, result.table)
    result.metrics.write(args.metrics)
    return 0


def _progress(started: float):
    def report(done: int, total: int, counts) -> None:
        print(f"repair {done}/{total} rows: {counts['repaired']} repaired, {counts['kept']} kept, "
              f"{counts['not_searched']} not searched ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return report


if __name__ == "__main__":
    sys.exit(main())
