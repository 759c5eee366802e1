"""DVC gate stage `gate_repair`: expectations/repair.json, with the check it names.

python -m stages.gate_repair expectations/repair.json data/repair/tokens.parquet \
    --input before=data/tokens/tokens.parquet --input responses=data/responses/responses.parquet \
    --input contract=data/contract/contract.json --input vocab=data/contract/vocab.parquet \
    --metric data/gates/repair.json --result data/gates/repair.details.json --params params.yaml --docs reports/data_docs

The engine of every gate (draftgate/gates/validate.py) runs the suite; this stage hands it the check
the suite names (`"compute": "repair"`), draftgate/checks/repair.py: the repaired rows made exact,
counted from the ids, against the interval their confidences predict, with precision and coverage
at repair.min_confidence. Exit 0 pass, 1 fail, 2 no verdict.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from draftgate.checks.repair import compute
    from draftgate.gates.validate import main as gate

    return gate(argv, checks={"repair": compute}, prog="python -m stages.gate_repair")


if __name__ == "__main__":
    sys.exit(main())
