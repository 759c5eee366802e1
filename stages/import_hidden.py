"""Stage `import_hidden`: hidden states extracted by another tool -> draftgate.hidden/1.

speculators (vLLM's extraction; draftgate/exchange/importer.py):
python -m stages.import_hidden --params params.yaml --hs DIR --dataset DIR \
    --tokens data/repair/tokens.parquet --out data/hidden [--vllm-layers 2,15,27] [--metrics FILE]
SpecForge (SGLang's; draftgate/exchange/import_specforge.py; the final state stays after the norm,
declared in the manifest):
python -m stages.import_hidden --format specforge --params params.yaml --hs DIR \
    --tokens data/repair/tokens.parquet --out data/hidden [--layers 1,14,26] [--metrics FILE]

The importers convert, the hidden gate judges. Then:
python -m stages.gate_hidden expectations/hidden.json data/hidden --input tokens=data/repair/tokens.parquet
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.import_hidden",
                                description="speculators (hs_<i>.safetensors + dataset) or SpecForge (*.ckpt) "
                                            "hidden states -> draftgate.hidden/1")
    p.add_argument("--format", choices=["speculators", "specforge"], default="speculators",
                   help="whose files --hs holds (default speculators)")
    p.add_argument("--params", required=True, type=Path, help="params.yaml: hidden: names the target, dtype, layers")
    p.add_argument("--hs", required=True, type=Path,
                   help="speculators: folder of hs_<i>.safetensors (--output); specforge: the --output-path "
                        "of prepare_hidden_states.py (*.ckpt / *.ckpt.gz under it)")
    p.add_argument("--dataset", type=Path,
                   help="speculators only (required there): its preprocessed dataset (save_to_disk folder), "
                        "or .parquet/.jsonl with input_ids, loss_mask")
    p.add_argument("--tokens", required=True, type=Path, help="draftgate's tokens.parquet the samples came from")
    p.add_argument("--out", required=True, type=Path, help="output folder (shards, index.parquet, manifest.json)")
    p.add_argument("--vllm-layers", help="layer ids vLLM captured, vLLM's convention (e.g. 2,15,27 or 2,15,27,30); "
                                         "default: hidden.layers (null: EAGLE-3's) + 1")
    p.add_argument("--layers", help="specforge: the --aux-hidden-states-layers it captured (0-based decoder-layer "
                                    "outputs, e.g. 1,14,26); default: hidden.layers (null: EAGLE-3's)")
    p.add_argument("--metrics", type=Path, help="write the import's figures here (JSON)")
    args = p.parse_args(argv)
    if args.format == "speculators" and args.dataset is None:
        p.error("--format speculators needs --dataset (the preprocessed dataset beside hs_<i>.safetensors)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.exchange.import_specforge import SpecForgeError, import_specforge
    from draftgate.exchange.importer import SpeculatorsError, import_speculators
    from draftgate.hidden.shards import ShardError
    from draftgate.target import TargetError
    from draftgate.io import write_json

    try:
        hp = load_params(args.params).hidden
        if args.format == "specforge":
            layers = [int(x) for x in args.layers.split(",")] if args.layers else None
            stats = import_specforge(args.hs, args.tokens, args.out, hp, layers)
        else:
            layers = [int(x) for x in args.vllm_layers.split(",")] if args.vllm_layers else None
            stats = import_speculators(args.hs, args.dataset, args.tokens, args.out, hp, layers)
    except (ParamsError, SpeculatorsError, SpecForgeError, ShardError, TargetError, ValueError, OSError) as e:
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
