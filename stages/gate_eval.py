"""DVC gate stage `gate_eval`: expectations/eval.json, with the check it names.

python -m stages.gate_eval expectations/eval.json ARTIFACT --input NAME=PATH ... \
    --metric data/gates/eval.json --result data/gates/eval.details.json --params params.yaml --docs reports/data_docs

The engine of every gate (draftgate/gates/validate.py) runs the suite; this stage hands it the check
the suite names (`"compute": "eval"`), draftgate/checks/eval.py: every speculative output against the gate's own plain greedy decoding.
Exit 0 pass, 1 fail, 2 no verdict.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from draftgate.checks.eval import compute
    from draftgate.gates.validate import main as gate

    return gate(argv, checks={"eval": compute}, prog="python -m stages.gate_eval")


if __name__ == "__main__":
    sys.exit(main())
