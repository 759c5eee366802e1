"""DVC stage `contract`: the tokenizer and template contracts (draftgate/contract.py) -> contract.json.

python -m stages.contract --params params.yaml --out data/contract/contract.json \
    --vocab data/contract/vocab.parquet --metrics metrics/contract.json [--defer-to-gate]

Exit 1 when the contract fails (the JSON is written first), 0 with --defer-to-gate: gate_contract
then fails on it, and the Data Docs show every failed check. Exit 2 when it cannot be checked.
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.contract", description=__doc__.splitlines()[0])
    p.add_argument("--params", default="params.yaml", help="params file (tokenizer, template, contract)")
    p.add_argument("--out", required=True, help="contract JSON to write")
    p.add_argument("--metrics", help="stage metrics JSON to write")
    p.add_argument("--vocab", help="Parquet of every id's bytes (id, hex), for the gates to decode with")
    p.add_argument("--defer-to-gate", action="store_true", help=(
        "exit 0 even when the contract fails: the gate stage on contract.json fails instead, and the "
        "Data Docs show the failing checks"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate import contract
    from draftgate.config import ParamsError, load_params
    from draftgate.io import write_json, write_parquet
    from draftgate.templates.base import TemplateError
    from draftgate.tokenizers import TokenizerError

    try:
        done = contract.run(load_params(args.params))
    except (ParamsError, TokenizerError, TemplateError, contract.ContractError) as e:
        print(f"contract: {e}", file=sys.stderr)
        return 2
    write_json(args.out, done.result.to_dict())
    if args.vocab:
        write_parquet(args.vocab, contract.vocab_table(done.tok))
    if args.metrics:
        done.metrics.write(args.metrics)
    lines, fails = contract.summary(done.result, args.out)
    print("\n".join(lines))
    for line in fails:
        print(line, file=sys.stderr)
    tc = done.result.template_contract
    return 0 if (done.result.ok and tc.ok and tc.complete) or args.defer_to_gate else 1


if __name__ == "__main__":
    sys.exit(main())
