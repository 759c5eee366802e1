"""DVC gate stage for a SQL-only suite: one artifact + its suite -> metric, result, Data Docs.

python -m stages.gate SUITE ARTIFACT [--input NAME=PATH ...] --metric data/gates/<suite>.json \
    --result data/gates/<suite>.details.json --params params.yaml --docs reports/data_docs

The same engine as `draftgate validate` (draftgate/gates/validate.py); exit 0 pass, 1 fail, 2 no
verdict. A suite that computes (`"compute"`) runs through its own stage, stages/gate_<name>.py.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from draftgate.gates.validate import main as gate

    return gate(argv, checks={}, prog="python -m stages.gate")


if __name__ == "__main__":
    sys.exit(main())
