"""The drafter gate's check: a table recomputed from the exported files (docs/drafter.md, "Gate").

    python -m stages.gate_drafter expectations/drafter.json data/drafter/sglang/config.json
        --input speculators=data/drafter/speculators/config.json --input hidden=data/hidden
        --input tokens=data/tokens/tokens.parquet --input loss=data/drafter/loss_curve.json ...

One row per export layout (the folder of each config.json): the problems each engine would have
loading it (by that engine's naming rules, from the safetensors header and config.json), NaN
tensors, the aux layer ids against the hidden stage's manifest, `tie_word_embeddings`, the
vocabulary map rebuilt from tokens.parquet (drafter.splits, drafter.draft_vocab_size) against the
exported `d2t` and the recorded data hash against the file's, and the loss drop read from the
loss curve. Nothing the train stage wrote about itself is trusted; the suite's expectations judge.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

LAYOUTS = {"sglang": "sglang", "speculators": "vllm"}   # layout -> the engine that loads it


def layout_row(layout: str, export_dir: Path, layers: dict | None, vocab_ok: dict, loss_drop: float) -> dict[str, Any]:
    from draftgate.drafter.export import WEIGHTS, check_export, layer_config

    engine = LAYOUTS[layout]
    problems = check_export(export_dir, engine, expected_layers=layers)
    kinds = Counter(p.kind for p in problems)
    tie = None
    try:
        cfg = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))
        tie = layer_config(cfg, engine).get("tie_word_embeddings")
    except (OSError, ValueError):
        pass
    d2t_ok, data_ok = vocab_ok.get(layout, (False, False))
    return {
        "layout": layout, "engine": engine, "path": str(export_dir),
        "file_errors": kinds["files"],
        "missing_keys": kinds["missing_key"],
        "skipped_keys": kinds["skipped_key"],
        "shape_errors": kinds["shape"] + kinds["dtype"],
        "config_errors": kinds["config"],
        "aux_layers_match": kinds["aux_layers"] == 0 and (export_dir / WEIGHTS).is_file(),
        "tie_word_embeddings": tie if isinstance(tie, bool) else None,
        "nan_tensors": kinds["nan"],
        "vocab_map_matches": d2t_ok,
        "vocab_data_hash_matches": data_ok,
        "loss_drop": loss_drop,
        "problems": "; ".join(p.message for p in problems)[:2000],
    }


def vocab_checks(exports: dict[str, Path], tokens: Path, splits: list[str], size: int) -> dict[str, tuple[bool, bool]]:
    """Per layout: (the exported d2t equals the map rebuilt from tokens.parquet, the export's
    recorded data sha256 equals the file's)."""
    import numpy as np
    from safetensors import safe_open

    from draftgate.drafter.export import WEIGHTS, read_info
    from draftgate.drafter.vocab import vocab_from_tokens
    from draftgate.io import file_sha256

    out = {}
    sha = file_sha256(tokens)
    cache: dict[int, Any] = {}
    for layout, d in exports.items():
        try:
            with safe_open(str(d / WEIGHTS), framework="numpy") as f:
                names = [n for n in f.keys() if "d2t" in n]
                d2t = f.get_tensor(names[0]) if names else None
                t2d_names = [n for n in f.keys() if "t2d" in n]
                vocab_size = int(f.get_slice(t2d_names[0]).get_shape()[0]) if t2d_names else None
            recorded = read_info(d).get("vocab", {}).get("data_sha256")
        except Exception:  # unreadable files are reported by check_export's file_errors
            out[layout] = (False, False)
            continue
        if d2t is None or vocab_size is None:
            out[layout] = (False, recorded == sha)
            continue
        if vocab_size not in cache:
            cache[vocab_size] = vocab_from_tokens(tokens, splits, size, vocab_size)[0]
        vmap = cache[vocab_size]
        same = d2t.shape == vmap.d2t.shape and bool(np.array_equal(d2t.astype(np.int64), vmap.d2t))
        out[layout] = (same, recorded == sha)
    return out


def build_table(sglang: Path, speculators: Path, hidden: Path, tokens: Path, loss: Path, params_path: Path) -> dict:
    from draftgate.config import load_params
    from draftgate.drafter.train import loss_drop, read_loss_curve

    params = load_params(params_path)
    manifest = json.loads((hidden / "manifest.json").read_text(encoding="utf-8"))
    layers = manifest["layers"]
    try:
        drop = loss_drop(read_loss_curve(loss), params.gates.drafter.loss_window)
    except (OSError, KeyError, ValueError):
        drop = 0.0
    exports = {"sglang": sglang, "speculators": speculators}
    vocab = vocab_checks(exports, tokens, params.drafter.splits, params.drafter.draft_vocab_size)
    rows = [layout_row(name, d, layers, vocab, drop) for name, d in exports.items()]
    return {"layouts": rows, "hidden_layers": layers, "loss_curve": str(loss)}


def compute(inputs: dict[str, str], params_path: str):
    """Check `drafter` (handed to the engine by stages/gate_drafter.py): the table `drafter_layouts`."""
    import pyarrow as pa

    from draftgate.config import ParamsError
    from draftgate.gates.compute import Computed
    from draftgate.gates.suite import GateError

    need = ("drafter", "speculators", "hidden", "tokens", "loss")
    missing = [n for n in need if n not in inputs]
    if missing:
        raise GateError("the drafter gate reads the SGLang export's config.json (the artifact) and --input "
                        "speculators=<speculators export>/config.json, hidden=data/hidden, tokens=<tokens.parquet>, "
                        f"loss=<loss curve JSON>; missing: {', '.join(missing)}")
    hidden = Path(inputs["hidden"])
    hidden = hidden if hidden.is_dir() else hidden.parent
    try:
        table = build_table(Path(inputs["drafter"]).parent, Path(inputs["speculators"]).parent, hidden,
                            Path(inputs["tokens"]), Path(inputs["loss"]), Path(params_path))
    except (ParamsError, OSError, ValueError, KeyError) as e:
        raise GateError(f"drafter gate: {type(e).__name__}: {e}; rerun the train and hidden stages") from None
    rows = table["layouts"]
    return Computed(tables={"drafter_layouts": pa.Table.from_pylist(rows)},
                    report={"hidden_layers": table["hidden_layers"],
                            "problems": {r["layout"]: r["problems"] for r in rows}})
