"""DVC gate stage `gate_composition`: expectations/composition.json, with the check it names.

python -m stages.gate_composition expectations/composition.json tokens=data/repair/tokens.parquet \
    --input contract=data/contract/contract.json --input vocab=data/contract/vocab.parquet \
    --metric data/gates/composition.json --result data/gates/composition.details.json --params params.yaml \
    --docs reports/data_docs

The engine of every gate (draftgate/gates/validate.py) runs the suite; this stage hands it the check
the suite names (`"compute": "composition"`), draftgate/checks/serving.py: the serving profile as a
table and the ids a tool declaration holds. The suite recomputes each row's mode from its ids.
Exit 0 pass, 1 fail, 2 no verdict.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from draftgate.checks.serving import compute
    from draftgate.gates.validate import main as gate

    return gate(argv, checks={"composition": compute}, prog="python -m stages.gate_composition")


if __name__ == "__main__":
    sys.exit(main())
