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

The weights themselves (docs/drafter.md, "Gate"): the two layouts must hold the same values under
their engines' names (`weights_match`), and the exported drafter, loaded by the SGLang layout's
rules and run by the gate at TTT step 0 on `gates.drafter.check_rows` stored training rows (the
hidden shards' aux and final, the tokens table's ids and mask) against the target's own
distribution, must reach the step-0 loss the loss curve ends at (`step0_loss_ratio`): untrained
(re-initialised) weights or permuted fc rows keep the loss near ln(draft vocabulary).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

LAYOUTS = {"sglang": "sglang", "speculators": "vllm"}   # layout -> the engine that loads it


def layout_row(layout: str, export_dir: Path, layers: dict | None, vocab_ok: dict, loss_drop: float,
               weights: dict | None = None) -> dict[str, Any]:
    from draftgate.drafter.export import WEIGHTS, check_export, layer_config

    engine = LAYOUTS[layout]
    problems = check_export(export_dir, engine, expected_layers=layers)
    tie = None
    try:
        cfg = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))
        tie = layer_config(cfg, engine).get("tie_word_embeddings")
        if engine == "vllm":
            problems += vllm_reading_problems(cfg)
        # Either layout may be served by vLLM (it loads the SGLang layout too, issue 27).
        problems += vllm_aux_problems(cfg, layers)
    except (OSError, ValueError):
        pass
    kinds = Counter(p.kind for p in problems)
    weights = weights or {}
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
        "vllm_misreads": kinds["vllm_misread"],
        "weights_match": weights.get("match"),
        "step0_loss": weights.get("loss"),
        "step0_claimed_loss": weights.get("claimed"),
        "step0_loss_ratio": weights.get("ratio"),
        "step0_accuracy": weights.get("accuracy"),
        "problems": "; ".join([p.message for p in problems] + weights.get("problems", []))[:2000],
    }


def vllm_reading_problems(cfg: dict) -> list:
    """The speculators config read as vLLM reads it, and what it would misload.

    vLLM (vllm/transformers_utils/configs/speculators/base.py,
    SpeculatorsConfig.extract_transformers_pre_trained_config, and algos.py update_eagle3) builds
    the drafter's config from `transformer_layer_config` alone, then copies only draft_vocab_size,
    target_hidden_size, norm_before_residual (default true), norm_before_fc (default false) and
    eagle_aux_hidden_state_layer_ids from the top level. So a top-level `tie_word_embeddings` is
    never what vLLM uses, while any reader that takes config.json as one PretrainedConfig (the
    speculators library, transformers) does: a top-level value other than false makes the file
    say "tied" to those and "untied" to vLLM. `norm_before_fc: true` makes vLLM put an RMSNorm
    before fc whose weight our drafter does not have (it stays at its initial value).
    """
    from draftgate.drafter.export import Problem

    out = []
    top = cfg.get("tie_word_embeddings", False)
    if top is not False:
        nested = (cfg.get("transformer_layer_config") or {}).get("tie_word_embeddings")
        out.append(Problem("vllm_misread", "tie_word_embeddings",
                           f"top-level tie_word_embeddings {top!r}: vLLM reads transformer_layer_config's "
                           f"({nested!r}) and ignores it, other readers of config.json tie the LM head to the "
                           "embedding; remove it or set it false"))
    if cfg.get("norm_before_fc", False) is not False:
        out.append(Problem("vllm_misread", "norm_before_fc",
                           f"norm_before_fc {cfg.get('norm_before_fc')!r}: vLLM would add an RMSNorm before fc that "
                           "this drafter does not have; set it false"))
    return out


def vllm_aux_problems(cfg: dict, layers: dict | None) -> list:
    """The target layers vLLM captures for this config, against those the drafter was trained on.

    vLLM (v1/worker/gpu_model_runner.py `_get_eagle3_aux_layers_from_config`, and
    v1/worker/gpu/spec_decode/eagle/eagle3_utils.py) takes the draft config's top-level
    `eagle_aux_hidden_state_layer_ids`, else `eagle_config.eagle_aux_hidden_state_layer_ids`, as
    its capture points as given: the input of layer i (the hidden stage's `sglang_vllm` list).
    SGLang's eagle_config holds 0-based layer outputs (its runner adds 1), so an SGLang config
    without the top-level list is read one layer early, silently: (1, 14, 26) for SmolLM2, trained
    on (2, 15, 27); acceptance 1.2107 against 1.2247 on the demo (docs/engines.md, "Acceptance").
    """
    from draftgate.drafter.export import Problem

    if not layers:
        return []
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    read = top or (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    want = list(layers["sglang_vllm"])
    if read is None or list(read) == want:
        return []       # no ids at all: check_export's aux_layers problem says so for either engine
    where = "eagle_aux_hidden_state_layer_ids" if top else "eagle_config.eagle_aux_hidden_state_layer_ids"
    return [Problem("vllm_misread", "eagle_aux_hidden_state_layer_ids",
                    f"vLLM reads {where} {list(read)} as its capture points (the input of each layer); the drafter "
                    f"was trained on {want} in that convention (hidden manifest sglang_vllm): served by vLLM it "
                    f"would see other layers. Re-export (the train stage writes a top-level "
                    f"eagle_aux_hidden_state_layer_ids {want}, which vLLM reads first and SGLang ignores) or serve "
                    "the speculators layout")]


def same_weights(exports: dict[str, Path]) -> tuple[bool, list[str]]:
    """Both layouts hold the same tensors: every file name mapped to its drafter parameter by its
    engine's rules, the values compared in float32 (equal dtypes give equal bytes)."""
    import torch
    from safetensors import safe_open

    from draftgate.drafter.export import WEIGHTS, _canonical

    read = {}
    for layout, d in exports.items():
        try:
            with safe_open(str(d / WEIGHTS), framework="pt") as f:
                read[layout] = {(_canonical(n, LAYOUTS[layout]) or n): f.get_tensor(n) for n in f.keys()}
            # The speculators layout ships the target's (frozen) embedding for speculators' loader,
            # SGLang's shares the target's: not a trained weight, so not compared here.
            read[layout].pop("embed_tokens.weight", None)
        except Exception as e:   # unreadable files are reported by check_export's file_errors
            return False, [f"{d / WEIGHTS}: unreadable ({' '.join(str(e).split())[:200]})"]
    a, b = (read[k] for k in exports)
    if set(a) != set(b):
        return False, [f"the layouts hold different tensors: {sorted(set(a) ^ set(b))[:6]}"]
    differ = [k for k in sorted(a) if a[k].shape != b[k].shape
              or not torch.equal(a[k].float() if a[k].is_floating_point() else a[k],
                                 b[k].float() if b[k].is_floating_point() else b[k])]
    return not differ, ([f"the layouts' weights differ in {differ[:6]}"] if differ else [])


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


def claimed_step0_loss(loss: Path, window: int) -> float | None:
    """The step-0 loss the curve ends at: the mean `loss_0` of its last `window` steps."""
    try:
        rows = json.loads(Path(loss).read_text(encoding="utf-8"))
        vals = [float(r["loss_0"]) for r in rows]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not vals:
        return None
    tail = vals[-max(1, min(window, len(vals))):]
    return sum(tail) / len(tail)


def read_rows(hidden: Path, wanted: set[str]) -> dict[str, tuple]:
    """(aux [T,3,H], final [T,H]) of the `wanted` prompt ids, read from the shards' own metadata
    and row offsets (docs/hidden-states.md), one shard at a time."""
    from safetensors import safe_open

    out = {}
    for path in sorted(hidden.glob("shard-*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            pids = json.loads((f.metadata() or {}).get("prompt_ids", "[]"))
            here = [i for i, p in enumerate(pids) if p in wanted and p not in out]
            if not here:
                continue
            bounds = f.get_tensor("row_offsets").tolist()
            aux, final = f.get_slice("aux"), f.get_slice("final")
            for i in here:
                a, b = bounds[i], bounds[i + 1]
                out[pids[i]] = (aux[a:b].float(), final[a:b].float())
    return out


def step0_check(sglang: Path, hidden: Path, tokens: Path, loss: Path, params: Any) -> dict:
    """The exported weights at work: step-0 soft cross-entropy and accuracy of the SGLang export
    (loaded by its engine's names) on a seeded sample of stored training rows, against the
    target's distribution over the draft vocabulary (the export's own d2t/t2d, which
    vocab_map_matches ties to the tokens table), as training defines them (draftgate/drafter/
    train.py: position t feeds aux[t] and token t+1 and predicts token t+2; it counts where token
    t+2 is a completion token and the target's argmax at t+1 is a draft id)."""
    import random

    from draftgate.drafter.export import ExportError, load_drafter
    from draftgate.drafter.vocab import training_rows
    from draftgate.target import TargetError, load_target

    gp = params.gates.drafter
    claimed = claimed_step0_loss(loss, gp.loss_window)
    out: dict[str, Any] = {"claimed": claimed, "problems": []}
    try:
        target = load_target(params.hidden, gp.device, "gates.drafter.device")
        model = load_drafter(sglang, embed=target.embed_tokens.weight.detach().float().cpu(), device=target.device)
    except (TargetError, ExportError, KeyError, ValueError, OSError, RuntimeError) as e:
        # A corrupted export is this check's failure (step0_loss_ratio null, the reason in problems),
        # never an internal error of the gate.
        out["problems"].append(f"step-0 check: {' '.join(str(e).split())[:300]}")
        return out
    pids, rows = training_rows(tokens, params.drafter.splits)
    pick = sorted(random.Random(gp.check_seed).sample(range(len(pids)), min(gp.check_rows, len(pids))))
    feats = read_rows(hidden, {pids[i] for i in pick})
    try:
        loss_sum, hits, n = _step0(model, target, pick, pids, rows, feats, hidden, out["problems"])
    except (RuntimeError, IndexError) as e:     # a loaded export whose tensors do not compute (a d2t out of range)
        out["problems"].append(f"step-0 check: the export does not run: {' '.join(str(e).split())[:300]}")
        return out
    if n:
        out.update(loss=loss_sum / n, accuracy=hits / n, positions=n)
        if claimed:
            out["ratio"] = out["loss"] / claimed
    else:
        out["problems"].append("step-0 check: no loss position in the sampled training rows")
    return out


def _step0(model: Any, target: Any, pick: list[int], pids: list[str], rows: list, feats: dict, hidden: Path,
           problems: list[str]) -> tuple[float, int, int]:
    """(summed soft cross-entropy, hits, positions) of the export at TTT step 0 on the picked rows."""
    import torch

    dev = target.device
    draft_ids = torch.arange(model.config.draft_vocab_size, device=dev) + model.d2t
    loss_sum, hits, n = 0.0, 0, 0
    with torch.inference_mode():
        for i in pick:
            if pids[i] not in feats:
                problems.append(f"training row {pids[i]} has no features in {hidden}")
                continue
            aux, final = (x.to(dev) for x in feats[pids[i]])
            ids = torch.as_tensor(rows[i][0], dtype=torch.long, device=dev)
            mask = torch.as_tensor(rows[i][1], device=dev) != 0
            t = int(ids.shape[0])
            if t < 3 or aux.shape[0] != t:
                continue
            full = target.logits_from_final(final)                    # [T, V]
            argmax = full.argmax(-1)
            pos = torch.arange(t - 2, device=dev)
            valid = mask[pos + 2] & model.t2d[argmax[pos + 1]]
            pos = pos[valid]
            if not pos.numel():
                continue
            hidden_states = model.ttt(aux[None], ids[None], 1)[0][0]
            logq = torch.log_softmax(model.logits(hidden_states[pos]).float(), -1)
            p = torch.softmax(full[pos + 1][:, draft_ids], -1)
            loss_sum += float(-(p * logq).sum(-1).sum())
            hits += int((model.to_target(logq.argmax(-1)) == argmax[pos + 1]).sum())
            n += int(pos.numel())
    return loss_sum, hits, n


def build_table(sglang: Path, speculators: Path, hidden: Path, tokens: Path, loss: Path, params_path: Path) -> dict:
    import time

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
    started = time.perf_counter()
    match, why = same_weights(exports)
    weights = {"match": match, **step0_check(sglang, hidden, tokens, loss, params)}
    weights["problems"] = why + weights["problems"]
    seconds = time.perf_counter() - started
    rows = [layout_row(name, d, layers, vocab, drop, weights) for name, d in exports.items()]
    return {"layouts": rows, "hidden_layers": layers, "loss_curve": str(loss),
            "weights": {k: weights.get(k) for k in ("loss", "claimed", "ratio", "accuracy", "positions")}
                       | {"seconds": round(seconds, 3)}}


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
                    report={"hidden_layers": table["hidden_layers"], "step0": table["weights"],
                            "problems": {r["layout"]: r["problems"] for r in rows}})
