"""DVC gate stage `gate_hidden`: expectations/hidden.json, with the check it names.

python -m stages.gate_hidden expectations/hidden.json ARTIFACT --input NAME=PATH ... \
    --metric data/gates/hidden.json --result data/gates/hidden.details.json --params params.yaml --docs reports/data_docs

The engine of every gate (draftgate/gates/validate.py) runs the suite; this stage hands it the check
the suite names (`"compute": "hidden"`), draftgate/checks/hidden.py: the hidden-state shards against the tokens table and the target (a forward pass).
Exit 0 pass, 1 fail, 2 no verdict.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from draftgate.checks.hidden import compute
    from draftgate.gates.validate import main as gate

    return gate(argv, checks={"hidden": compute}, prog="python -m stages.gate_hidden")


if __name__ == "__main__":
    sys.exit(main())
