"""DVC gate stage `gate_drafter`: expectations/drafter.json, with the check it names.

python -m stages.gate_drafter expectations/drafter.json ARTIFACT --input NAME=PATH ... \
    --metric data/gates/drafter.json --result data/gates/drafter.details.json --params params.yaml --docs reports/data_docs

The engine of every gate (draftgate/gates/validate.py) runs the suite; this stage hands it the check
the suite names (`"compute": "drafter"`), draftgate/checks/drafter.py: the exports by each engine's naming rules, the vocabulary map rebuilt from tokens.
Exit 0 pass, 1 fail, 2 no verdict.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from draftgate.checks.drafter import compute
    from draftgate.gates.validate import main as gate

    return gate(argv, checks={"drafter": compute}, prog="python -m stages.gate_drafter")


if __name__ == "__main__":
    sys.exit(main())
