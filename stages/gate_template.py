"""DVC gate stage `gate_template`: expectations/template.json, with the check it names.

python -m stages.gate_template expectations/template.json data/contract/contract.json \
    --metric data/gates/template.json --result data/gates/template.details.json --params params.yaml --docs reports/data_docs

The engine of every gate (draftgate/gates/validate.py) runs the suite; this stage hands it the check
the suite names (`"compute": "template"`), draftgate/checks/template.py: each probe's stored
conversation read again into shape features, and every (feature, mode) counted from them and the renders.
Exit 0 pass, 1 fail, 2 no verdict.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from draftgate.checks.template import compute
    from draftgate.gates.validate import main as gate

    return gate(argv, checks={"template": compute}, prog="python -m stages.gate_template")


if __name__ == "__main__":
    sys.exit(main())
