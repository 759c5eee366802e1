"""DVC stage `prompts`: raw prompt files -> prompts.parquet + rejects.parquet + metrics.

python -m stages.prompts --params params.yaml --raw data/raw --out data/prompts --metrics metrics/prompts.json \
    --gate data/gates/contract.json --gate data/gates/template.json

Exit 0 even with rejects (the prompts gate decides); exit 2 when the input cannot be used at all,
or a contract gate did not pass.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stages.prompts", description=__doc__.splitlines()[0])
    p.add_argument("--params", required=True, help="params.yaml (reads the prompts section)")
    p.add_argument("--raw", required=True, help="directory of *.jsonl / *.parquet prompt files")
    p.add_argument("--out", required=True, help="output directory for prompts.parquet and rejects.parquet")
    p.add_argument("--metrics", required=True, help="metrics JSON to write")
    p.add_argument("--gate", action="append", default=[], type=Path, metavar="METRIC",
                   help="an upstream gate's metric (data/gates/contract.json, data/gates/template.json); "
                        "refuses to run unless each records success (repeatable)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.gates.result import GateNotPassed, require_passed
    from draftgate.prompts.run import PromptsRequest, run

    try:
        params = load_params(args.params)
        for gate in args.gate:   # the tokenizer and template contracts: nothing is rendered before them
            require_passed(gate, f"gate_{gate.stem}", "fix the contract (tokenizer, template params) first")
        done = run(params, PromptsRequest(raw=Path(args.raw), out=Path(args.out)))
    except (ParamsError, GateNotPassed, OSError, ValueError) as e:
        print(f"stages.prompts: {e}", file=sys.stderr)
        return 2
    done.metrics.write(args.metrics)
    print(done.summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
