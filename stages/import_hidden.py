"""Stage `import_hidden`: hidden states vLLM extracted in the speculators format -> data/hidden.

python -m stages.import_hidden --params params.yaml --hs DIR --dataset DIR \
    --tokens data/tokens/tokens.parquet --out data/hidden [--vllm-layers 2,15,27] [--metrics FILE]

The conversion is draftgate/hidden/importer.py's; it converts, the hidden gate judges. Then:
python -m stages.gate_hidden expectations/hidden.json data/hidden --input tokens=data/tokens/tokens.parquet
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.import_hidden",
                                description="speculators hidden states (hs_<i>.safetensors + dataset) -> draftgate.hidden/1")
    p.add_argument("--params", required=True, type=Path, help="params.yaml: hidden: names the target, dtype, layers")
    p.add_argument("--hs", required=True, type=Path, help="folder of hs_<i>.safetensors (speculators --output)")
    p.add_argument("--dataset", required=True, type=Path,
                   help="speculators' preprocessed dataset (save_to_disk folder), or .parquet/.jsonl with input_ids, loss_mask")
    p.add_argument("--tokens", required=True, type=Path, help="draftgate's tokens.parquet the samples came from")
    p.add_argument("--out", required=True, type=Path, help="output folder (shards, index.parquet, manifest.json)")
    p.add_argument("--vllm-layers", help="layer ids vLLM captured, vLLM's convention (e.g. 2,15,27 or 2,15,27,30); "
                                         "default: hidden.layers (null: EAGLE-3's) + 1")
    p.add_argument("--metrics", type=Path, help="write the import's figures here (JSON)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.hidden.importer import SpeculatorsError, import_speculators
    from draftgate.hidden.shards import ShardError
    from draftgate.hidden.target import TargetError
    from draftgate.io import write_json

    try:
        hp = load_params(args.params).hidden
        layers = [int(x) for x in args.vllm_layers.split(",")] if args.vllm_layers else None
        stats = import_speculators(args.hs, args.dataset, args.tokens, args.out, hp, layers)
    except (ParamsError, SpeculatorsError, ShardError, TargetError, ValueError, OSError) as e:
        print(f"import_hidden: {e}", file=sys.stderr)
        return 1
    if args.metrics:
        write_json(args.metrics, stats)
    print(f"import_hidden: {stats['imported']} of {stats['samples']} samples -> {stats['rows']} rows, "
          f"{stats['tokens']:,} tokens in {stats['shards']} shards under {args.out} "
          f"({stats['missing_files']} without a file, {stats['unmatched']} matching no kept tokens row); "
          f"validate: python -m stages.gate_hidden expectations/hidden.json {args.out} --input tokens={args.tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
