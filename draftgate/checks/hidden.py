"""The hidden gate's check: what the stored features ARE, recomputed from the raw files and the target.

`compute(inputs, params_path)` (handed to the engine by stages/gate_hidden.py) reads the hidden-state
directory (shards, index, manifest: docs/hidden-states.md), the tokens table and the target named
by params.yaml `hidden:`, and returns three tables for expectations/hidden.json's view:

    hidden_rows    one per row found INSIDE the shards (their own prompt_ids metadata and
                   row_offsets, not the index): whether its ids and loss mask equal the tokens
                   table's, finiteness, how many completion tokens the stored final state
                   explains, log-probabilities, the whole-table aux checks (every row: the
                   target's first layers against the lowest aux slot, its last layers from the
                   highest slot against the final state, the middle slot's tie to the lowest),
                   and for a seeded sample of rows the error against the gate's own forward pass
    hidden_shards  one per shard on disk or in the manifest: actual sha256, bytes, shapes, dtype
    hidden_facts   one row: the target's config and the layers/dtype params expect, beside what
                   the manifest claims; the tokens file's actual sha256

Nothing here decides pass or fail: the suite's view joins and counts, and its expectations judge
with thresholds from `gates.hidden`. Memory is bounded by one shard (read, scored, released) plus
the tokens table's ids as numpy arrays and the sampled rows' features. The manifest is read only for what it claims (hashes, layers) so
the view can hold the claims against the recomputed values, and for nothing about where rows are.

Independent on purpose: the shards are read here with safetensors directly (their tensors and
metadata as docs/hidden-states.md defines them), not through hidden/shards.py or hidden/reader.py,
so a bug in the producer's parser cannot hide itself from the gate; a manifest that is missing or
not JSON is a finding for the view, not an exception. The only shared code is what is not the
producer's judgement: the target loader, the layer convention and io.file_sha256.

The independent re-extraction uses the model's own `output_hidden_states` (HF index i+1 for
0-based decoder layer i) and, for the final state before the norm, the input of the final norm
module: never the producer's per-layer hooks (docs/hidden-gate.md).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgate.gates.compute import Computed
from draftgate.gates.suite import GateError
from draftgate.io import file_sha256

FORMAT = "draftgate.hidden/1"   # the layout this reader understands; the manifest's claim is held against it
SHARD_GLOB = "shard-*.safetensors"
ID_MASK_BYTES = 9            # input_ids int64 + loss_mask uint8, per token
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
EPS = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "float32": 2.0 ** -23}
LOGIT_CHUNK = 512            # positions per LM-head matmul: 512 x vocab x 4 bytes (~100 MB at 49k)


@dataclass(frozen=True)
class KeptRow:
    dataset: str
    input_ids: Any                # numpy int64 [T]
    loss_mask: Any                # numpy uint8 [T]


# ------------------------------------------------------------ entry point

def compute(inputs: dict[str, str], params_path: str) -> Computed:
    from draftgate.config import ParamsError, load_params

    try:
        params = load_params(params_path)
    except ParamsError as e:
        raise GateError(str(e)) from None
    if "hidden" not in inputs or "tokens" not in inputs:
        raise GateError("the hidden gate reads the hidden-state directory (artifact `hidden`) and "
                        "--input tokens=data/tokens/tokens.parquet")
    hidden_dir = Path(inputs["hidden"])
    hidden_dir = hidden_dir.parent if hidden_dir.is_file() else hidden_dir
    tokens_path = Path(inputs["tokens"])
    if not tokens_path.is_file():
        raise GateError(f"--input tokens={tokens_path}: not a file; run the reconstruct stage")
    gp = params.gates.hidden
    kept = read_kept(tokens_path)
    target = cached_target(params.hidden, gp.device)
    layers = expected_layers(params.hidden.layers, target.num_layers)
    greedy = sampling_is_greedy(gp.sampling, params.generate)
    if not hidden_dir.is_dir():
        raise GateError(f"{hidden_dir}: no hidden-state directory; run the hidden stage (dvc repro hidden)")
    manifest = read_manifest(hidden_dir)
    # A declared after-norm final state (a SpecForge import: docs/interop.md) is recomputed as such:
    # scored without the norm, compared with the norm's output. A wrong declaration fails the
    # final-state chain and the re-extraction, so the claim is checked, not trusted.
    post_norm = manifest.get("final_state") == "after_norm"
    chosen = choose_resample(hidden_dir, gp.resample_rows, gp.resample_seed)
    timer = {"aux_chain_s": 0.0}
    rows, shards, stored = scan_shards(hidden_dir, manifest, target, kept, greedy, gp.top_k, chosen, layers, timer,
                                       post_norm)
    errors = resample(stored, target, layers, post_norm)
    for r in rows:
        r.update(errors.get((r["shard"], r["row"]), {"resampled": False}))
        dtype = r.pop("dtype", None)
        r["tolerance"] = tolerance(dtype, gp.tolerance_eps, gp.min_tolerance)
        r["chain_tolerance"] = tolerance(dtype, gp.chain_tolerance_eps, gp.min_tolerance)
    facts = model_facts(manifest, target, layers, params.hidden.dtype, tokens_path)
    return Computed(tables=as_tables(rows, shards, facts),
                    report=report(rows, greedy, target, layers, gp, timer))


# ------------------------------------------------------------ inputs

def read_kept(tokens_path: Path) -> dict[str, KeptRow]:
    """The tokens table's kept rows (quarantine_reason IS NULL): the rows features must exist for.
    (A duplicate prompt id keeps its first row: the tokens gate fails duplicates.)"""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    cols = ["prompt_id", "dataset", "input_ids", "loss_mask", "quarantine_reason"]
    kept: dict[str, KeptRow] = {}
    try:
        pf = pq.ParquetFile(tokens_path)
        for batch in pf.iter_batches(columns=cols, batch_size=4096):
            batch = batch.filter(pc.is_null(batch.column("quarantine_reason")))
            pids, datasets = batch.column("prompt_id").to_pylist(), batch.column("dataset").to_pylist()
            lists = [batch.column(c) for c in ("input_ids", "loss_mask")]
            flat = [lst.values.to_numpy(zero_copy_only=False).astype(dt) for lst, dt in zip(lists, (np.int64, np.uint8))]
            offs = [lst.offsets.to_numpy() for lst in lists]
            for i, pid in enumerate(pids):
                if pid not in kept:
                    ids = flat[0][offs[0][i] - offs[0][0]:offs[0][i + 1] - offs[0][0]]
                    mask = flat[1][offs[1][i] - offs[1][0]:offs[1][i + 1] - offs[1][0]]
                    kept[pid] = KeptRow(datasets[i] or "", ids, mask)
    except Exception as e:  # pyarrow raises several types for a bad file or a missing column
        raise GateError(f"--input tokens={tokens_path}: unreadable ({' '.join(str(e).split())}); "
                        "rerun the reconstruct stage") from None
    return kept


_TARGETS: dict[str, Any] = {}


def cached_target(hidden_params: Any, device: str) -> Any:
    """The target, loaded once per process and params (tests run several gates on the same weights)."""
    from draftgate.config import as_dict
    from draftgate.target import TargetError, load_target

    key = json.dumps([as_dict(hidden_params), device], sort_keys=True)
    if key not in _TARGETS:
        try:
            _TARGETS.clear()   # one target resident at a time
            _TARGETS[key] = load_target(hidden_params, device, "gates.hidden.device")
        except TargetError as e:
            raise GateError(str(e)) from None
    return _TARGETS[key]


def expected_layers(layers: Any, num_layers: int) -> list[int]:
    from draftgate.target import resolve_layers

    try:
        return list(resolve_layers(layers, num_layers))
    except ValueError as e:
        raise GateError(str(e)) from None


def sampling_is_greedy(sampling: str, generate: Any) -> bool:
    """Whether the completions were decoded greedily (docs/hidden-gate.md, "Greedy or sampled").

    "generate": the temperature of generate's request bodies (extra_body merges last, so its
    temperature wins). Every row of responses.parquet was answered under exactly these params:
    a journal line whose request hash differs from the current params' is regenerated, and the
    hash covers the temperature (draftgate/client/request.py).
    """
    if sampling != "generate":
        return sampling == "greedy"
    temperature = (generate.extra_body or {}).get("temperature", generate.temperature)
    return float(temperature) == 0.0


def read_manifest(hidden_dir: Path) -> dict:
    """The manifest's claims, or {} / {"_unreadable": True}: the view judges a missing manifest
    (the producer's reader would raise instead)."""
    path = hidden_dir / "manifest.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}            # judged by the view: every claim compares as missing
    except ValueError:
        return {"_unreadable": True}
    return doc if isinstance(doc, dict) else {"_unreadable": True}


# ------------------------------------------------------------ shards

def choose_resample(hidden_dir: Path, n: int, seed: int) -> set[tuple[str, int]]:
    """A seeded sample of (shard, row) among the rows the shards hold (their metadata only)."""
    from safetensors import safe_open

    keys = []
    for path in sorted(hidden_dir.glob(SHARD_GLOB)):
        try:
            with safe_open(str(path), framework="pt") as f:
                count = len(json.loads((f.metadata() or {}).get("prompt_ids", "[]")))
        except Exception:   # an unreadable shard fails its own check; nothing to sample there
            continue
        keys.extend((path.name, i) for i in range(count))
    return set(random.Random(seed).sample(keys, min(n, len(keys))))


def scan_shards(hidden_dir: Path, manifest: dict, target: Any, kept: dict[str, KeptRow], greedy: bool,
                top_k: int, chosen: set[tuple[str, int]], layers: list[int],
                timer: dict | None = None, post_norm: bool = False) -> tuple[list[dict], list[dict], dict]:
    """Every shard on disk, row by row, plus manifest shards that are missing on disk.

    Returns (rows, shards, stored): `stored` maps the `chosen` (shard, row) keys to copies of
    their (ids, aux, final), for the re-extraction.
    """
    listed = {s.get("name"): s for s in manifest.get("shards") or [] if isinstance(s, dict)}
    on_disk = sorted(p.name for p in hidden_dir.glob(SHARD_GLOB))
    rows: list[dict] = []
    shards: list[dict] = []
    stored: dict[tuple[str, int], tuple] = {}
    for name in sorted(set(on_disk) | {n for n in listed if isinstance(n, str)}):
        claim = listed.get(name, {})
        fact = {"name": name, "on_disk": name in on_disk, "in_manifest": name in listed,
                "manifest_sha256": claim.get("sha256"), "manifest_rows": _int(claim.get("rows")),
                "manifest_tokens": _int(claim.get("tokens")), "sha256": None, "bytes": None,
                "rows": None, "tokens": None, "dtype": None, "hidden_size": None, "aux_slots": None,
                "shapes_consistent": None, "problem": None}
        if name in on_disk:
            path = hidden_dir / name
            fact["sha256"] = file_sha256(path)
            fact["bytes"] = path.stat().st_size
            try:
                shard_rows, shard_stored = read_shard(path, fact, target, kept, greedy, top_k, chosen, layers, timer,
                                                      post_norm)
            except ShardError as e:
                fact["problem"] = str(e)
            else:
                rows.extend(shard_rows)
                stored.update(shard_stored)
        shards.append(fact)
    return rows, shards, stored


class ShardError(ValueError):
    """A shard the gate cannot read as draftgate.hidden/1 (a missing tensor, bad offsets): becomes
    the shard's `problem`, never raised out of the gate."""


def read_shard(path: Path, fact: dict, target: Any, kept: dict[str, KeptRow], greedy: bool,
               top_k: int, chosen: set[tuple[str, int]], layers: list[int] | None = None,
               timer: dict | None = None, post_norm: bool = False) -> tuple[list[dict], dict]:
    import time

    import numpy as np
    import torch
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            names = set(f.keys())
            missing = {"input_ids", "loss_mask", "row_offsets", "aux", "final"} - names
            if missing:
                raise ShardError(f"missing tensors {sorted(missing)}")
            ids, mask, offsets = f.get_tensor("input_ids"), f.get_tensor("loss_mask"), f.get_tensor("row_offsets")
            aux, final = f.get_tensor("aux"), f.get_tensor("final")
    except ShardError:
        raise
    except Exception as e:  # safetensors raises its own error types for a truncated or foreign file
        raise ShardError(f"unreadable as safetensors: {' '.join(str(e).split())}") from None
    try:
        prompt_ids = json.loads(meta.get("prompt_ids", "null"))
    except ValueError:
        prompt_ids = None
    if not isinstance(prompt_ids, list):
        raise ShardError("metadata prompt_ids is not a JSON list")
    t = int(ids.shape[0])
    fact.update(rows=len(prompt_ids), tokens=t, dtype=str(aux.dtype).removeprefix("torch."),
                aux_slots=int(aux.shape[1]) if aux.dim() == 3 else None,
                hidden_size=int(aux.shape[-1]) if aux.dim() >= 2 else None,
                format=meta.get("format"))
    fact["shapes_consistent"] = bool(
        aux.dim() == 3 and final.dim() == 2 and aux.shape[0] == t and final.shape[0] == t
        and mask.shape == ids.shape and final.shape[1] == aux.shape[2] and final.dtype == aux.dtype
        and offsets.dim() == 1 and offsets.numel() == len(prompt_ids) + 1)
    if not fact["shapes_consistent"]:
        raise ShardError(f"shapes disagree: input_ids {tuple(ids.shape)}, loss_mask {tuple(mask.shape)}, "
                         f"aux {tuple(aux.shape)}, final {tuple(final.shape)}, row_offsets {tuple(offsets.shape)} "
                         f"for {len(prompt_ids)} prompt_ids")
    bounds = offsets.tolist()
    if bounds[0] != 0 or bounds[-1] != t or any(b > e for b, e in zip(bounds, bounds[1:])):
        raise ShardError(f"row_offsets {bounds[:4]}... do not cut [0, {t}) into rows")
    finite_tok = torch.isfinite(aux.float()).flatten(1).all(1) & torch.isfinite(final.float()).all(1)
    rows, stored = [], {}
    ids_np, mask_np = ids.numpy(), mask.numpy()
    for i, pid in enumerate(prompt_ids):
        a, b = bounds[i], bounds[i + 1]
        pid = pid if isinstance(pid, str) else None
        ref = kept.get(pid)
        row = {"shard": path.name, "row": i, "prompt_id": pid, "offset": a, "length": b - a,
               "dataset": ref.dataset if ref is not None else None,
               "ids_equal": None if ref is None else bool(np.array_equal(ids_np[a:b], ref.input_ids)),
               "mask_equal": None if ref is None else bool(np.array_equal(mask_np[a:b], ref.loss_mask)),
               "finite": bool(finite_tok[a:b].all()), "dtype": fact["dtype"], "greedy": greedy}
        # Explain the tokens table's ids where the row is kept (the ids check compares the two).
        ref_ids = ref.input_ids if ref is not None else ids_np[a:b]
        ref_mask = ref.loss_mask if ref is not None else mask_np[a:b]
        row.update(explain(final[a:b], ref_ids, ref_mask, target, greedy, top_k, post_norm) if row["finite"] else
                   {"scored": None, "explained": None, "logprob_sum": None})
        if row["finite"] and layers is not None and aux.shape[1] == len(layers):
            started = time.perf_counter()
            row.update(aux_chain(aux[a:b], final[a:b], ref_ids, ref_mask, target, layers, post_norm))
            if timer is not None:
                timer["aux_chain_s"] += time.perf_counter() - started
        rows.append(row)
        if (path.name, i) in chosen:
            stored[(path.name, i)] = (ids[a:b].clone(), aux[a:b].clone(), final[a:b].clone())
    return rows, stored


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# ------------------------------------------------------------ features explain the tokens

def explain(final: Any, ids: Any, mask: Any, target: Any, greedy: bool, top_k: int, post_norm: bool = False) -> dict:
    """Score the completion tokens: the state at t must predict the token at t+1.

    Positions t with loss_mask[t+1] = 1 (tokens the target generated). Logits = LM head of the
    final norm of the stored state (stored before the norm: docs/hidden-states.md; a declared
    after-norm state goes to the head as it is, as SpecForge's TargetHead does). A greedy row's
    token must be the argmax; a sampled row's within the top_k (ties counted in its favour).
    A row whose stored length differs from the ids scores only the overlap (the ids check fails it).
    """
    import torch

    ids = torch.as_tensor(ids, dtype=torch.int64)
    mask = torch.as_tensor(mask)
    n = min(int(ids.numel()), int(final.shape[0]), int(mask.numel()))
    index = torch.nonzero(mask[1:n] != 0).flatten()     # t such that loss_mask[t+1] = 1
    if not index.numel():
        return {"scored": 0, "explained": 0, "logprob_sum": 0.0}
    nxt = ids[index + 1]
    norm, head = target.norm, target.lm_head
    param = next(norm.parameters())
    explained, logprob = 0, 0.0
    with torch.inference_mode():
        for s in range(0, int(index.numel()), LOGIT_CHUNK):
            h = final[index[s:s + LOGIT_CHUNK]].to(device=param.device, dtype=param.dtype)
            logits = head(h if post_norm else norm(h)).float()
            want = nxt[s:s + LOGIT_CHUNK].to(logits.device)
            valid = (want >= 0) & (want < logits.shape[1])    # an id outside the vocabulary explains nothing
            chosen = logits.gather(1, want.clamp(0, logits.shape[1] - 1)[:, None])
            if greedy:
                hit = logits.argmax(1) == want
            else:
                hit = (logits > chosen).sum(1) < top_k
            explained += int((hit & valid).sum())
            logprob += float((chosen[:, 0] - torch.logsumexp(logits, 1))[valid].sum())
    return {"scored": int(index.numel()), "explained": explained, "logprob_sum": logprob}


# ------------------------------------------------------------ whole-table aux checks

MIN_MARGIN_POSITIONS = 16    # completion positions a row needs for its middle-slot margin to be judged


class _Enough(Exception):
    """Raised by a forward hook once the layer the gate needs has run: the rest is not computed."""


def aux_chain(aux: Any, final: Any, ids: Any, mask: Any, target: Any, layers: list[int],
              post_norm: bool = False) -> dict:
    """Tie every row's three aux slots to its ids and to its (separately verified) final state,
    for a fraction of a forward pass (docs/hidden-gate.md, "Every row's aux features"):

    - low_error: the target's own forward over the tokens table's ids, stopped after the lowest
      aux layer (2 of SmolLM2's 30), against the stored lowest slot;
    - top_error: the target's layers after the highest aux layer (3 of 30) run from the stored
      highest slot, against the stored final state (which the explain check and the resample tie
      to the tokens);
    - mid_margin: the middle slot's mean cosine to the lowest slot at the same completion
      position, minus its mean cosine to the lowest slot at every other completion position of
      the row. A residual stream keeps a token's direction from layer to layer; another row's
      features do not. The baseline is all other positions, not one shift: a row that repeats
      itself (a list, a loop) matches itself half a row away, and a single-shift baseline read
      a sampled row of our own as 0.069. None under MIN_MARGIN_POSITIONS completion positions.
    Relative L2 errors as `rel_err`; a length that differs from the ids gives None (the ids check
    fails the row already).
    """
    import torch

    ids = torch.as_tensor(ids, dtype=torch.int64)
    param = next(target.base.parameters())
    order = sorted(range(len(layers)), key=lambda j: layers[j])     # slots by depth (hidden.layers may be unsorted)
    lo, mid, hi = order[0], order[1], order[-1]
    out: dict[str, Any] = {"low_error": None, "top_error": None, "mid_margin": None}
    if int(ids.numel()) == int(aux.shape[0]):
        low = first_layers(target, ids.to(param.device), layers[lo])
        out["low_error"] = rel_err(aux[:, lo], low)
    top = last_layers(target, aux[:, hi].to(device=param.device, dtype=param.dtype), layers[hi] + 1)
    if post_norm:   # the declared after-norm state is the norm's output of what the last layers give
        with torch.inference_mode():
            top = target.norm(top)
    out["top_error"] = rel_err(final, top)
    m = torch.as_tensor(mask)[: aux.shape[0]] != 0
    if int(m.sum()) >= MIN_MARGIN_POSITIONS:
        out["mid_margin"] = mid_margin(aux[m, lo], aux[m, mid])
    return out


def mid_margin(low: Any, mid: Any) -> float:
    """The middle slot's mean cosine to the lowest slot at the same position minus its mean cosine
    to the lowest slot at every other position ([n, H] each, n >= 2): about 0.2-0.3 for a row's
    own features, about 0 for another row's (docs/hidden-gate.md)."""
    from torch.nn import functional as F

    low, mid = F.normalize(low.float(), dim=-1), F.normalize(mid.float(), dim=-1)
    n = low.shape[0]
    same = (mid * low).sum(-1)
    # the mean cosine to every other position through the sum of the unit vectors: O(n H), no n x n matrix
    away = (mid @ low.sum(0) - same) / (n - 1)
    return float((same - away).mean())


def first_layers(target: Any, ids: Any, layer: int) -> Any:
    """The output of decoder layer `layer` for one row: the model's own forward (embedding, mask,
    rotary positions as the model makes them), stopped by a hook once that layer has run."""
    import torch

    seen: dict[str, Any] = {}

    def stop(_module: Any, _args: Any, output: Any) -> None:
        seen["h"] = output[0] if isinstance(output, tuple) else output
        raise _Enough

    handle = target.layers[layer].register_forward_hook(stop)
    try:
        with torch.inference_mode():
            target.base(input_ids=ids[None], use_cache=False)
    except _Enough:
        pass
    finally:
        handle.remove()
    return seen["h"][0]


def last_layers(target: Any, hidden: Any, start: int) -> Any:
    """Decoder layers start..N-1 run on one row's stored state [T, H] (causal, positions 0..T-1),
    the input of the final norm: what the target computes from that state onwards. The layers are
    called as the model's own forward calls them (hidden, 4-d additive causal mask, position ids,
    rotary embeddings), which every Llama-family decoder layer of transformers 5 takes."""
    import torch

    x = hidden[None]
    t = int(x.shape[1])
    pos = torch.arange(t, device=x.device)[None]
    causal = torch.full((t, t), float("-inf"), device=x.device, dtype=x.dtype).triu(1)[None, None]
    with torch.inference_mode():
        emb = target.base.rotary_emb(x, position_ids=pos)
        for block in target.layers[start:]:
            x = block(x, attention_mask=causal, position_ids=pos, position_embeddings=emb, use_cache=False)
            x = x[0] if isinstance(x, tuple) else x
    return x[0]


# ------------------------------------------------------------ independent re-extraction

def resample(stored: dict, target: Any, layers: list[int], post_norm: bool = False) -> dict:
    """Re-extract the chosen rows with the model's own output_hidden_states; per row the
    relative L2 error of each stored aux slot and of the final state (the final norm's input, or
    its output for a declared after-norm state)."""
    import torch

    base = target.base
    param = next(base.parameters())
    out = {}
    for key in sorted(stored):
        ids, aux, final = stored[key]
        seen: dict[str, Any] = {}

        def grab(_module: Any, args: Any) -> None:   # the final norm's input: the state before it
            seen["final"] = args[0]

        def grab_output(_module: Any, _args: Any, output: Any) -> None:   # the state after it
            seen["final"] = output

        handle = (target.norm.register_forward_hook(grab_output) if post_norm
                  else target.norm.register_forward_pre_hook(grab))
        try:
            with torch.inference_mode():
                res = base(input_ids=ids[None].to(param.device), output_hidden_states=True, use_cache=False)
        finally:
            handle.remove()
        hs = res.hidden_states
        aux_err = [rel_err(aux[:, j], hs[layer + 1][0]) for j, layer in enumerate(layers[:aux.shape[1]])]
        worst = None if not aux_err or None in aux_err else max(aux_err)
        out[key] = {"resampled": True, "aux_error": worst,
                    "final_error": rel_err(final, seen["final"][0])}
    return out


def rel_err(stored: Any, ref: Any) -> float | None:
    """||stored - ref|| / ||ref|| in float32; None when shapes differ (a truncated row)."""
    if tuple(stored.shape) != tuple(ref.shape):
        return None
    s, r = stored.float().cpu(), ref.float().cpu()
    den = float(r.norm())
    val = float((s - r).norm()) / den if den > 0 else float((s - r).norm())
    return val if math.isfinite(val) else None


def tolerance(dtype: str | None, eps_factor: float, floor: float) -> float:
    """Allowed relative error for features stored in `dtype`: rounding to it moves each element by
    at most half an epsilon, so the L2 error of a row is below one epsilon; compute noise (batching,
    kernels) sits under `floor`."""
    return max(eps_factor * EPS.get(dtype or "", EPS["float32"]), floor)


# ------------------------------------------------------------ manifest claims beside the facts

def model_facts(manifest: dict, target: Any, layers: list[int], dtype: str, tokens_path: Path) -> dict:
    model = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
    claimed = manifest.get("layers") if isinstance(manifest.get("layers"), dict) else {}
    return {
        "manifest_present": bool(manifest) and not manifest.get("_unreadable"),
        "manifest_format": manifest.get("format"),
        "format": FORMAT,
        "manifest_tokens_sha256": manifest.get("tokens_sha256"),
        "tokens_sha256": file_sha256(tokens_path),
        "manifest_hidden_size": _int(model.get("hidden_size")),
        "hidden_size": target.hidden_size,
        "manifest_num_layers": _int(model.get("num_hidden_layers")),
        "num_layers": target.num_layers,
        "manifest_weights": model.get("weights_fingerprint"),
        "weights": target.weights_fingerprint,
        "manifest_layers": json.dumps(claimed.get("eagle3")),
        "layers": json.dumps(layers),
        "manifest_hf_layers": json.dumps(claimed.get("hf_hidden_states")),
        "hf_layers": json.dumps([i + 1 for i in layers]),
        "manifest_dtype": manifest.get("dtype"),
        "dtype": dtype,
        "expected_bytes_per_token": 4 * target.hidden_size * ITEMSIZE[dtype] + ID_MASK_BYTES,
        "manifest_final_state": manifest.get("final_state"),
        "manifest_rows": _int(manifest.get("rows")),
        "manifest_tokens": _int(manifest.get("tokens")),
    }


# ------------------------------------------------------------ outputs

def as_tables(rows: list[dict], shards: list[dict], facts: dict) -> dict:
    import pyarrow as pa

    row_schema = pa.schema([
        ("shard", pa.string()), ("row", pa.int64()), ("prompt_id", pa.string()), ("offset", pa.int64()),
        ("length", pa.int64()), ("dataset", pa.string()), ("ids_equal", pa.bool_()), ("mask_equal", pa.bool_()),
        ("finite", pa.bool_()), ("greedy", pa.bool_()), ("scored", pa.int64()), ("explained", pa.int64()),
        ("logprob_sum", pa.float64()), ("resampled", pa.bool_()), ("aux_error", pa.float64()),
        ("final_error", pa.float64()), ("tolerance", pa.float64()),
        ("low_error", pa.float64()), ("top_error", pa.float64()), ("chain_tolerance", pa.float64()),
        ("mid_margin", pa.float64()),
    ])
    shard_schema = pa.schema([
        ("name", pa.string()), ("on_disk", pa.bool_()), ("in_manifest", pa.bool_()), ("sha256", pa.string()),
        ("manifest_sha256", pa.string()), ("bytes", pa.int64()), ("rows", pa.int64()), ("tokens", pa.int64()),
        ("manifest_rows", pa.int64()), ("manifest_tokens", pa.int64()), ("dtype", pa.string()),
        ("hidden_size", pa.int64()), ("aux_slots", pa.int64()), ("shapes_consistent", pa.bool_()),
        ("format", pa.string()), ("problem", pa.string()),
    ])
    norm_rows = [{k: r.get(k) for k in row_schema.names} for r in rows]
    norm_shards = [{k: s.get(k) for k in shard_schema.names} for s in shards]
    return {"hidden_rows": pa.Table.from_pylist(norm_rows, schema=row_schema),
            "hidden_shards": pa.Table.from_pylist(norm_shards, schema=shard_schema),
            "hidden_facts": pa.Table.from_pylist([facts])}


def report(rows: list[dict], greedy: bool, target: Any, layers: list[int], gp: Any, timer: dict | None = None) -> dict:
    """The figures a reviewer reads in the result file: mean log-probability of the completion
    tokens per dataset (under the target, from the stored states), explained shares, the resample."""
    per: dict[str, list[float]] = {}
    scored = explained = 0
    for r in rows:
        if r.get("scored"):
            ds = r["dataset"] if r["dataset"] is not None else "(not kept)"
            acc = per.setdefault(ds, [0.0, 0])
            acc[0] += r["logprob_sum"]
            acc[1] += r["scored"]
            scored += r["scored"]
            explained += r["explained"]
    resampled = [{"prompt_id": r["prompt_id"], "aux_error": r.get("aux_error"), "final_error": r.get("final_error"),
                  "tolerance": r.get("tolerance")} for r in rows if r.get("resampled")]
    return {
        "mean_completion_logprob": {ds: round(s / n, 6) for ds, (s, n) in sorted(per.items())},
        "completion_tokens": {ds: n for ds, (_, n) in sorted(per.items())},
        "sampling": "greedy (argmax)" if greedy else f"sampled (top-{gp.top_k})",
        "explained": explained, "scored": scored,
        "explained_share": round(explained / scored, 6) if scored else None,
        "layers": layers, "target": {"kind": target.kind, "weights": target.weights_fingerprint,
                                     "hidden_size": target.hidden_size, "num_layers": target.num_layers},
        "resampled": resampled,
        "aux_chain": {**_spread(rows, "low_error"), **_spread(rows, "top_error"), **_spread(rows, "mid_margin"),
                      "seconds": round((timer or {}).get("aux_chain_s", 0.0), 3)},
    }


def _spread(rows: list[dict], key: str) -> dict:
    vals = sorted(r[key] for r in rows if r.get(key) is not None)
    if not vals:
        return {key: None}
    return {key: {"min": round(vals[0], 6), "median": round(vals[len(vals) // 2], 6), "max": round(vals[-1], 6)}}
