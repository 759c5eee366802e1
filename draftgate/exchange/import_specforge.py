"""Import SpecForge's offline hidden-state files into a draftgate.hidden/1 directory.

SpecForge (sgl-project/SpecForge 0.2.0) prepares EAGLE-3 features with SGLang and stores one
`torch.save` dict per sample (`scripts/prepare_hidden_states.py` writes `rows_<a>-<b>/data_<i>.ckpt`;
its LocalFeatureStore dump writes `<sample_id>.ckpt`; either may be gzipped as `.ckpt.gz`). Its
reader (runtime/data_plane/offline_reader.py) takes every `*.ckpt` / `*.ckpt.gz` under a folder,
sorted, and the keys (docs/interop.md, "SpecForge's offline files"):

- `input_ids` [T] and `loss_mask` [T] (SpecForge's own template's mask);
- `aux_hidden_state` [1, T, 3H]: the three capture layers concatenated on the last axis, in the
  order captured (SGLang's `set_eagle3_layers_to_capture(ids)` captures the input of layer id+1 =
  our 0-based decoder-layer output `id`: the same numbers as our `hidden.layers`);
- `hidden_state` [1, T, H]: the final state AFTER the final norm. SGLang's logits processor receives
  the normed states (`hidden_states`; the pre-norm ones travel separately as
  `hidden_states_before_norm`) and SpecForge keeps those as `last_hidden_states`; its training
  passes them through the LM head alone (modeling/target/target_head.py: `TargetHead` is just
  `lm_head`). An RMSNorm cannot be undone (the scale is gone), so the import keeps them as they
  are and declares `final_state: after_norm` in the manifest; the hidden gate recomputes under
  that declaration (docs/interop.md, "The final state").

As the speculators importer (draftgate/exchange/importer.py), this one converts and does not judge:
each file becomes one row under the kept tokens row with exactly its ids (each used once, in table
order), else `specforge:<i>` (i: the file's position in that sorted list), which the gate
fails as a row without a kept tokens row.

    python -m stages.import_hidden --format specforge --params params.yaml --hs DIR \\
        --tokens data/tokens/tokens.parquet --out data/hidden-specforge
"""

from __future__ import annotations

import gzip
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

SUFFIXES = (".ckpt", ".ckpt.gz")
KEYS = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")


class SpecForgeError(ValueError):
    """Input the importer cannot convert; the message says what to fix."""


@dataclass(frozen=True)
class Sample:
    index: int                    # position in SpecForge's sorted file list
    input_ids: list[int]
    loss_mask: list[int]
    prompt_id: str | None = None  # always None: SpecForge's files carry no id (matched by ids)


def feature_files(root: Path) -> list[Path]:
    """Every `*.ckpt` / `*.ckpt.gz` under `root`, sorted by path: SpecForge's list_feature_files order."""
    root = Path(root)
    if not root.is_dir():
        raise SpecForgeError(f"{root}: not a folder; pass the --output-path SpecForge's prepare_hidden_states.py wrote")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
    if not files:
        raise SpecForgeError(f"{root}: no *.ckpt or *.ckpt.gz files (SpecForge's offline hidden states)")
    return files


def load_file(path: Path) -> dict[str, Any]:
    """One sample's dict, tensors only (weights_only: a pickle of anything else is refused)."""
    import torch

    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = torch.load(io.BytesIO(f.read()), weights_only=True, map_location="cpu")
        else:
            raw = torch.load(str(path), weights_only=True, map_location="cpu", mmap=True)
    except Exception as e:   # torch raises several types for a truncated or foreign file
        raise SpecForgeError(f"{path}: unreadable ({' '.join(str(e).split())[:300]}); re-extract this sample") from None
    if not isinstance(raw, dict):
        raise SpecForgeError(f"{path}: holds a {type(raw).__name__}, SpecForge's files hold a dict of {', '.join(KEYS)}")
    missing = [k for k in KEYS if k not in raw]
    if missing:
        raise SpecForgeError(f"{path}: no {missing[0]!r}; SpecForge's EAGLE-3 files hold {', '.join(KEYS)} "
                             "(prepare_hidden_states.py with --enable-aux-hidden-states)")
    return raw


def split_sample(path: Path, raw: dict[str, Any], hidden_size: int, dtype: str,
                 features: bool = True) -> tuple[Any, Any, Any, Any]:
    """(input_ids int64 [T], loss_mask uint8 [T], aux [T,3,H], final [T,H]) in `dtype`; with
    features=False the shapes are checked (metadata of the memory-mapped file) and aux, final None."""
    import torch

    ids = raw["input_ids"].reshape(-1).to(torch.int64)
    mask = raw["loss_mask"].reshape(-1)
    aux, final = raw["aux_hidden_state"], raw["hidden_state"]
    aux = aux.squeeze(0) if aux.dim() == 3 else aux
    final = final.squeeze(0) if final.dim() == 3 else final
    t = ids.numel()
    if aux.dim() != 2 or final.dim() != 2 or aux.shape[0] != t or final.shape[0] != t or mask.numel() != t:
        raise SpecForgeError(f"{path}: aux_hidden_state {tuple(raw['aux_hidden_state'].shape)}, hidden_state "
                             f"{tuple(raw['hidden_state'].shape)}, loss_mask {tuple(raw['loss_mask'].shape)} for "
                             f"{t} input_ids; expected [1, T, 3H], [1, T, H] and [T]")
    if final.shape[1] != hidden_size or aux.shape[1] != 3 * hidden_size:
        raise SpecForgeError(f"{path}: hidden_state width {final.shape[1]}, aux_hidden_state width {aux.shape[1]}; "
                             f"the target's hidden size is {hidden_size} (3 aux layers: {3 * hidden_size}): "
                             "these features are another model's, or not 3 capture layers (check hidden: in params)")
    mask = (mask != 0).to(torch.uint8)
    if not features:
        return ids, mask, None, None
    out = getattr(torch, dtype)
    # The concatenation [low | mid | high] on the last axis becomes our slot axis.
    return ids, mask, aux.reshape(t, 3, hidden_size).to(out).contiguous(), final.to(out).contiguous()


def import_specforge(ckpt_dir: Path, tokens_path: Path, out: Path, hp: Any,
                     layers: Sequence[int] | None = None) -> dict[str, Any]:
    """Convert; the figures for the stage's metrics. `layers`: the ids SpecForge captured
    (--aux-hidden-states-layers, our convention), default `hidden.layers` (null: EAGLE-3's)."""
    import numpy as np

    from draftgate.target import resolve_layers
    from draftgate.exchange.importer import assign_prompt_ids, target_identity, write_imported
    from draftgate.hidden.shards import TokenRows, read_token_rows

    start = time.perf_counter()
    files = feature_files(ckpt_dir)
    tokens = read_token_rows(tokens_path)
    target = target_identity(hp)
    layers = resolve_layers(layers if layers is not None else hp.layers, target.num_layers)
    # First pass: ids and masks (the files are memory-mapped; the features are read again per shard).
    samples, masks = [], []
    for i, path in enumerate(files):
        ids, mask, _, _ = split_sample(path, load_file(path), target.hidden_size, hp.dtype, features=False)
        samples.append(Sample(i, ids.tolist(), mask.tolist()))
        masks.append(mask.numpy())
    pids = [p.replace("speculators:", "specforge:") for p in assign_prompt_ids(samples, tokens)]
    rows = TokenRows(pids, [np.asarray(s.input_ids, dtype=np.int64) for s in samples], masks, tokens.sha256)
    source = {"format": "specforge", "dir": str(ckpt_dir), "files": len(files), "capture_layers": list(layers)}

    def features(i: int) -> tuple[Any, Any]:
        _, _, aux, final = split_sample(files[i], load_file(files[i]), target.hidden_size, hp.dtype)
        return aux, final

    manifest, resumed = write_imported(out, rows, features, target, hp, layers, "after_norm", source)
    return {"samples": len(files), "imported": len(files), "missing_files": 0,
            "unmatched": sum(p.startswith("specforge:") for p in pids), "extra_files": 0,
            "rows": manifest["rows"], "tokens": manifest["tokens"], "shards": len(manifest["shards"]),
            "resumed_shards": resumed, "layers": list(layers), "final_state": "after_norm",
            "seconds": round(time.perf_counter() - start, 2)}
