"""Gated training data out, in the layouts SpecForge's and speculators' offline training read.

The rows are the ones draftgate's own trainer takes: kept tokens rows in `drafter.splits`, with
the hidden stage's features (a draftgate.hidden/1 directory the hidden gate passed), and the draft
vocabulary `drafter.draft_vocab_size` gives (draftgate/drafter/vocab.py, the map train builds).
docs/interop.md, "Gated data out", has the layouts and how each was proven by the library's own
loader (interop/data.py). In short, under `out/`:

    specforge/hidden_states/data_<i>.ckpt   torch.save dict per row: input_ids [T] and loss_mask [T]
                                            (int64), aux_hidden_state [1,T,3H] (the three layers
                                            concatenated, low to high), hidden_state [1,T,H] AFTER
                                            the target's final norm (what SpecForge's SGLang capture
                                            stores: its TargetHead is the LM head alone)
    specforge/vocab_mapping.pt              {"d2t": int64 [Vd], "t2d": bool [V]} (--vocab-mapping-path)
    speculators/                            save_to_disk dataset: input_ids (int64), loss_mask (int64),
                                            seq_len, prompt_id (its --data-path)
    speculators/hidden_states/hs_<i>.safetensors  token_ids [T], hidden_states [T,4,H]: 3 aux + the
                                            final state BEFORE the norm (its trainer applies the
                                            verifier's norm + LM head)
    speculators/d2t-<Vd>.npy, t2d-<Vd>.npy  where its train CLI looks for the vocab mapping
    export.json                             written last: rows (prompt id per index), figures, hashes

Row i of both layouts is the same tokens row (prompt_ids[i] in export.json). Every file is
written to a temp name and renamed; export.json last, so a folder without it is unfinished.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path
from typing import Any

FORMAT = "draftgate.export-data/1"
ARROW = "data-00000-of-00001.arrow"


class ExportError(ValueError):
    """The export cannot start; the message says why and the fix."""


# ------------------------------------------------------------ pure conversions

def specforge_sample(ids: Any, mask: Any, aux: Any, final_after_norm: Any) -> dict[str, Any]:
    """One SpecForge offline dict (the keys and shapes its OfflineEagle3Dataset reads)."""
    import torch

    t, _, h = aux.shape
    return {"input_ids": ids.to(torch.int64).contiguous(), "loss_mask": mask.to(torch.int64).contiguous(),
            "hidden_state": final_after_norm.reshape(1, t, h).contiguous(),
            "aux_hidden_state": aux.reshape(1, t, 3 * h).contiguous()}


def speculators_sample(ids: Any, aux: Any, final_before_norm: Any) -> dict[str, Any]:
    """One speculators hs_<i>.safetensors payload: token_ids, hidden_states [T, 4, H]."""
    import torch

    return {"token_ids": ids.to(torch.int64).contiguous(),
            "hidden_states": torch.cat([aux, final_before_norm[:, None]], dim=1).contiguous()}


def torch_save_bytes(obj: Any) -> bytes:
    """torch.save into memory: the zip's inner folder is then "archive" whatever the file is
    called (saving to a temp path would name it after the temp name, and the bytes would vary)."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_bytes(path: Path, data: bytes) -> str:
    from draftgate.io import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def hf_dataset_files(columns: dict[str, list], fingerprint: str) -> dict[str, bytes]:
    """The three files HF datasets' save_to_disk writes for one shard (Arrow IPC stream + state +
    info), torch format: `load_from_disk` returns tensors, as speculators' preprocessing leaves it."""
    import pyarrow as pa

    features = {"input_ids": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
                "loss_mask": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
                "seq_len": {"dtype": "int64", "_type": "Value"},
                "prompt_id": {"dtype": "string", "_type": "Value"}}
    schema = pa.schema([("input_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int64())),
                        ("seq_len", pa.int64()), ("prompt_id", pa.string())],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    table = pa.table({k: columns[k] for k in schema.names}, schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table)
    state = {"_data_files": [{"filename": ARROW}], "_fingerprint": fingerprint, "_format_columns": None,
             "_format_kwargs": {}, "_format_type": "torch", "_output_all_columns": False, "_split": None}
    info = {"citation": "", "description": "", "features": features, "homepage": "", "license": ""}
    return {ARROW: sink.getvalue().to_pybytes(), "state.json": json.dumps(state, indent=2).encode(),
            "dataset_info.json": json.dumps(info, indent=2).encode()}


# ------------------------------------------------------------ the export

def rows_to_export(source: Any, tokens_path: Path, params: Any, vocab_size: int) -> tuple[Any, list[str], dict]:
    """The draft vocabulary and the training rows (prompt ids in tokens-table order), as train takes them."""
    from draftgate.drafter.vocab import vocab_from_tokens

    vmap, prompt_ids, _ = vocab_from_tokens(tokens_path, params.drafter.splits, params.drafter.draft_vocab_size,
                                            vocab_size)
    have = set(source.prompt_ids)
    missing = [p for p in prompt_ids if p not in have]
    if missing:
        raise ExportError(f"{len(missing)} training rows have no features (e.g. {missing[0]!r}); rerun the hidden stage")
    dropped = {"split_not_trained": len(set(source.prompt_ids) - set(prompt_ids))}
    return vmap, prompt_ids, dropped


def norm_of(target: Any) -> Any:
    import torch

    param = next(target.norm.parameters())

    def apply(final: Any) -> Any:
        with torch.inference_mode():
            return target.norm(final.to(device=param.device, dtype=param.dtype)).to(final.dtype).cpu()

    return apply


def export_data(hidden_dir: Path, tokens_path: Path, out: Path, params: Any, target: Any = None,
                formats: tuple[str, ...] = ("specforge", "speculators")) -> dict[str, Any]:
    import numpy as np

    from draftgate.drafter.vocab import VocabError
    from draftgate.hidden.reader import OfflineFeatures
    from draftgate.hidden.shards import ShardError
    from draftgate.target import load_target
    from draftgate.io import safetensors_bytes, write_json

    start = time.perf_counter()
    try:
        source = OfflineFeatures(hidden_dir, tokens_path, verify_hashes=True)
    except ShardError as e:
        raise ExportError(str(e)) from None
    final_state = source.manifest.get("final_state", "before_norm")
    if final_state != "before_norm" and "speculators" in formats:
        raise ExportError(f"{hidden_dir}/manifest.json: final_state {final_state!r}; speculators trains on the "
                          "state before the norm, which an RMSNorm's output cannot give back: export "
                          "--formats specforge only, or extract with the hidden stage")
    target = target or load_target(params.hidden, device="cpu")
    try:
        vmap, prompt_ids, dropped = rows_to_export(source, tokens_path, params, target.vocab_size)
    except VocabError as e:
        raise ExportError(str(e)) from None
    normed = norm_of(target) if final_state == "before_norm" else (lambda f: f)
    out.mkdir(parents=True, exist_ok=True)
    (out / "export.json").unlink(missing_ok=True)     # unfinished from here until the end
    files: dict[str, str] = {}
    position = {pid: i for i, pid in enumerate(prompt_ids)}
    dataset_rows: list[Any] = [None] * len(prompt_ids)
    row_lengths = [0] * len(prompt_ids)
    tokens = 0
    # Storage order loads each shard once; row i of both layouts is prompt_ids[i] all the same.
    for j in source.order():
        i = position.get(source.prompt_ids[j])
        if i is None:
            continue
        sample = source[j]
        ids, mask = sample.input_ids, sample.loss_mask
        tokens += int(ids.numel())
        row_lengths[i] = int(ids.numel())
        if "specforge" in formats:
            name = f"specforge/hidden_states/data_{i:06d}.ckpt"
            files[name] = write_bytes(out / name, torch_save_bytes(
                specforge_sample(ids, mask, sample.aux, normed(sample.final))))
        if "speculators" in formats:
            name = f"speculators/hidden_states/hs_{i}.safetensors"
            files[name] = write_bytes(out / name, safetensors_bytes(speculators_sample(ids, sample.aux, sample.final)))
            dataset_rows[i] = (ids.tolist(), mask.to(int).tolist())
    columns = {"input_ids": [r[0] for r in dataset_rows if r], "loss_mask": [r[1] for r in dataset_rows if r],
               "seq_len": [len(r[0]) for r in dataset_rows if r], "prompt_id": list(prompt_ids)}
    if "specforge" in formats:
        import torch

        mapping = {"d2t": torch.from_numpy(vmap.d2t.astype(np.int64)), "t2d": torch.from_numpy(vmap.t2d)}
        files["specforge/vocab_mapping.pt"] = write_bytes(out / "specforge/vocab_mapping.pt", torch_save_bytes(mapping))
    if "speculators" in formats:
        fingerprint = hashlib.sha256(json.dumps(columns["prompt_id"]).encode()).hexdigest()[:16]
        for name, data in hf_dataset_files(columns, fingerprint).items():
            files[f"speculators/{name}"] = write_bytes(out / "speculators" / name, data)
        for key, arr in (("d2t", vmap.d2t.astype(np.int64)), ("t2d", vmap.t2d)):
            buf = io.BytesIO()
            np.save(buf, arr)
            name = f"speculators/{key}-{vmap.size}.npy"
            files[name] = write_bytes(out / name, buf.getvalue())
    stale = _remove_stale(out, set(files))
    stats = {"rows": len(prompt_ids), "tokens": tokens, "formats": list(formats), "dropped": dropped,
             "removed_stale_files": stale, "final_state_source": final_state,
             "draft_vocab": vmap.describe(), "seconds": round(time.perf_counter() - start, 2)}
    write_json(out / "export.json", {
        "format": FORMAT, **{k: v for k, v in stats.items() if k not in ("seconds", "removed_stale_files")},
        "prompt_ids": prompt_ids, "lengths": row_lengths,
        "hidden_size": source.hidden_size, "layers": list(source.layers),
        "dtype": source.dtype, "hidden_manifest": source.manifest.get("key"),
        "tokens_sha256": source.manifest.get("tokens_sha256"), "files": dict(sorted(files.items()))})
    return stats


def _remove_stale(out: Path, keep: set[str]) -> int:
    """Files of an earlier export this one did not write (fewer rows, another format)."""
    removed = 0
    for sub in ("specforge", "speculators"):
        for p in sorted((out / sub).rglob("*")) if (out / sub).is_dir() else []:
            if p.is_file() and p.relative_to(out).as_posix() not in keep:
                p.unlink()
                removed += 1
    return removed
