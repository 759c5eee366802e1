"""Import hidden states that vLLM extracted in the speculators format into a draftgate.hidden/1 directory.

For targets too large for transformers, speculators (vllm-project/speculators) extracts features
with a vLLM server (`extract_hidden_states`); docs/hidden-gate.md, "Importing speculators hidden
states", describes its files in our words. In short:

- one `hs_{i}.safetensors` per sample i of its preprocessed dataset, holding `token_ids` [T] and
  `hidden_states` [T, 4, H]: three auxiliary layers in ascending order, then the last layer's
  output BEFORE the final norm (its trainer applies a frozen norm + LM head);
- layer ids in vLLM's convention (captured at the input of that layer): default
  [2, N//2, N-3] for the aux slots and N for the final, = our 0-based [1, N//2-1, N-4];
- the dataset (`input_ids`, `loss_mask` per sample) saved by HF datasets `save_to_disk`: Arrow IPC
  stream files `data-*.arrow`. Parquet or JSONL with the same columns are accepted too.

The importer converts, it does not judge: each sample becomes one row with the ids the features
were computed on (the file's `token_ids`) and the dataset's loss mask, under the tokens-table
prompt id it belongs to (a `prompt_id` column when the dataset carries one, else the kept tokens
row with exactly these ids; neither: `speculators:<i>`). The hidden gate then validates the result
like the hidden stage's own output: a sample whose ids disagree with the tokens table fails there.
Shards, index and manifest are written by draftgate.hidden.shards, so resume and atomicity are the
stage's.

    python -m stages.import_hidden --params params.yaml --hs DIR --dataset DIR \
        --tokens data/tokens/tokens.parquet --out data/hidden [--vllm-layers 2,15,27]

(stages/import_hidden.py: import_speculators() returns the figures; the stage writes them.)
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

HS_RE = re.compile(r"^hs_(\d+)\.safetensors$")
SLOTS = 4   # 3 aux + the final state


class SpeculatorsError(ValueError):
    """Input the importer cannot convert; the message says what to fix."""


@dataclass(frozen=True)
class Sample:
    index: int                    # position in the speculators dataset = i of hs_{i}
    input_ids: list[int]
    loss_mask: list[int]
    prompt_id: str | None         # the dataset's own, when it has the column


# ------------------------------------------------------------ inputs

def read_dataset(path: Path) -> list[Sample]:
    """The speculators dataset: a `save_to_disk` folder (data-*.arrow), a .parquet or a .jsonl file."""
    import pyarrow as pa

    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.arrow"))
        if not files:
            raise SpeculatorsError(f"{path}: no *.arrow files; pass the folder speculators' prepare_data.py wrote")
        tables = []
        for f in files:
            with pa.memory_map(str(f)) as src:
                try:
                    tables.append(pa.ipc.open_stream(src).read_all())
                except pa.ArrowInvalid:   # the random-access file format, as some writers use
                    tables.append(pa.ipc.open_file(src).read_all())
        table = pa.concat_tables(tables)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    elif path.suffix in (".jsonl", ".ndjson"):
        import pyarrow.json as pj

        table = pj.read_json(path)
    else:
        raise SpeculatorsError(f"{path}: expected a save_to_disk folder, .parquet or .jsonl")
    missing = {"input_ids", "loss_mask"} - set(table.column_names)
    if missing:
        raise SpeculatorsError(f"{path}: no column {sorted(missing)[0]!r}; speculators datasets carry input_ids "
                           f"and loss_mask (found: {', '.join(table.column_names)})")
    pids = table.column("prompt_id").to_pylist() if "prompt_id" in table.column_names else [None] * table.num_rows
    return [Sample(i, list(ids), [int(x) for x in mask], pid) for i, (ids, mask, pid) in enumerate(
        zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(), pids))]


def hs_files(hs_dir: Path) -> dict[int, Path]:
    found = {int(m.group(1)): p for p in Path(hs_dir).iterdir() if (m := HS_RE.match(p.name))}
    if not found:
        raise SpeculatorsError(f"{hs_dir}: no hs_<i>.safetensors files; pass speculators' --output folder")
    return found


def assign_prompt_ids(samples: Sequence[Sample], tokens: Any) -> list[str]:
    """Each sample's tokens-table prompt id: its own column, else the kept row with identical ids
    (each kept row used once, in table order), else `speculators:<i>` (the gate then fails it)."""
    by_ids: dict[tuple, list[str]] = {}
    for pid, ids in zip(tokens.prompt_ids, tokens.input_ids):
        by_ids.setdefault(tuple(int(x) for x in ids), []).append(pid)
    out = []
    for s in samples:
        if s.prompt_id:
            out.append(s.prompt_id)
            continue
        free = by_ids.get(tuple(s.input_ids))
        out.append(free.pop(0) if free else f"speculators:{s.index}")
    return out


def load_sample(path: Path, dtype: str) -> tuple[Any, Any, Any]:
    """(token_ids int64 [T], aux [T,3,H], final [T,H]) of one hs_{i}.safetensors file."""
    import torch
    from safetensors.torch import load_file

    try:
        data = load_file(str(path))
    except Exception as e:   # safetensors raises its own types for a truncated file
        raise SpeculatorsError(f"{path}: unreadable ({' '.join(str(e).split())}); re-extract this sample") from None
    missing = {"token_ids", "hidden_states"} - set(data)
    if missing:
        raise SpeculatorsError(f"{path}: no tensor {sorted(missing)[0]!r}; speculators files hold token_ids and hidden_states")
    ids, hs = data["token_ids"].to(torch.int64).reshape(-1), data["hidden_states"]
    if hs.dim() != 3 or hs.shape[1] != SLOTS or hs.shape[0] != ids.numel():
        raise SpeculatorsError(f"{path}: hidden_states {tuple(hs.shape)} for {ids.numel()} token ids; expected "
                           f"[T, {SLOTS}, H] (3 aux layers + the final state, vLLM launched with 4 layer ids)")
    hs = hs.to(getattr(torch, dtype))
    return ids, hs[:, :3].contiguous(), hs[:, 3].contiguous()


# ------------------------------------------------------------ the target, without its weights in memory

def target_identity(hp: Any) -> Any:
    """A Target carrying config and fingerprints but no model (model=None): the manifest's identity
    for a target the importer never runs (it may not fit in transformers)."""
    import torch  # noqa: F401  (transformers' config classes want it importable)
    from transformers import AutoConfig

    from draftgate.target import Target, TargetError, weights_fingerprint

    if hp.kind == "embedded":
        from draftgate.serve.model import cached_weights, smollm2_tokenizer

        entry = cached_weights()
        path, fp, tok = Path(entry.path), entry.fingerprint, smollm2_tokenizer()
    else:
        from draftgate.config import TokenizerParams
        from draftgate.tokenizers import load_tokenizer

        path = Path(hp.path or "")
        files = sorted(p for p in path.glob("*") if p.suffix in (".safetensors", ".bin") and p.is_file())
        if not (path / "config.json").is_file() or not files:
            raise TargetError(f"hidden.path {hp.path!r}: not an HF model directory with weight files")
        fp = weights_fingerprint(files)
        tok = load_tokenizer(TokenizerParams(kind="hf_dir", path=str(path), trust_remote_code=hp.trust_remote_code))
    config = AutoConfig.from_pretrained(path, trust_remote_code=hp.trust_remote_code)
    config = getattr(config, "text_config", None) or config
    template = tok.hf.chat_template or ""
    return Target(model=None, config=config, kind=hp.kind, path=str(path), device="none",
                  compute_dtype=hp.compute_dtype, weights_fingerprint=fp, tokenizer_fingerprint=tok.fingerprint,
                  chat_template_sha256=hashlib.sha256(template.encode("utf-8")).hexdigest())


def our_layers(vllm_layers: Sequence[int] | None, hp: Any, num_layers: int) -> tuple[int, int, int]:
    """Our 0-based decoder-layer ids of the three aux slots. vLLM names the input of layer i, which
    is decoder layer i-1's output; the final slot (vLLM id N) is implied."""
    from draftgate.target import resolve_layers

    if vllm_layers is None:
        return resolve_layers(hp.layers, num_layers)
    ids = [int(i) for i in vllm_layers if int(i) != num_layers]
    return resolve_layers([i - 1 for i in ids], num_layers)


# ------------------------------------------------------------ the import

def import_speculators(hs_dir: Path, dataset: Path, tokens_path: Path, out: Path, hp: Any,
                       vllm_layers: Sequence[int] | None = None) -> dict[str, Any]:
    import numpy as np

    from draftgate.hidden.shards import TokenRows, read_token_rows

    start = time.perf_counter()
    samples = read_dataset(dataset)
    files = hs_files(hs_dir)
    tokens = read_token_rows(tokens_path)
    target = target_identity(hp)
    layers = our_layers(vllm_layers, hp, target.num_layers)
    pids = assign_prompt_ids(samples, tokens)
    present = [k for k, s in enumerate(samples) if s.index in files]
    # First pass: ids and masks only (the features are read again shard by shard, bounded memory).
    ids_of, mask_of = [], []
    for k in present:
        ids, aux, _ = load_sample(files[samples[k].index], hp.dtype)
        if aux.shape[-1] != target.hidden_size:
            raise SpeculatorsError(f"{files[samples[k].index]}: hidden size {aux.shape[-1]}, the target's is "
                               f"{target.hidden_size}: these features are another model's (check hidden: in params)")
        mask = samples[k].loss_mask[:ids.numel()] + [0] * max(0, ids.numel() - len(samples[k].loss_mask))
        ids_of.append(ids.numpy())
        mask_of.append(np.asarray(mask, dtype=np.uint8))
    rows = TokenRows([pids[k] for k in present], ids_of, mask_of, tokens.sha256)
    source = {"format": "speculators", "hs_dir": str(hs_dir), "dataset": str(dataset),
              "vllm_layers": [i + 1 for i in layers] + [target.num_layers]}

    def features(i: int) -> tuple[Any, Any]:
        _, aux, final = load_sample(files[samples[present[i]].index], hp.dtype)
        return aux, final

    manifest, resumed = write_imported(out, rows, features, target, hp, layers, "before_norm", source)
    return {"samples": len(samples), "imported": len(present), "missing_files": len(samples) - len(present),
            "unmatched": sum(p.startswith("speculators:") for p in rows.prompt_ids),
            "extra_files": len(set(files) - {s.index for s in samples}), "rows": manifest["rows"],
            "tokens": manifest["tokens"], "shards": len(manifest["shards"]), "resumed_shards": resumed,
            "layers": list(layers), "seconds": round(time.perf_counter() - start, 2)}


def write_imported(out: Path, rows: Any, features: Any, target: Any, hp: Any, layers: Sequence[int],
                   final_state: str, source: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Shards, index and manifest of imported rows through draftgate.hidden.shards (the hidden
    stage's own plan, resume and atomic writes). `features(i)` gives row i's (aux [T,3,H], final [T,H]);
    `final_state` is what the source stored ("before_norm" or "after_norm": docs/interop.md), written
    into the manifest for the gate to recompute under and for training to honour."""
    from draftgate.hidden.capture import layer_names
    from draftgate.hidden.shards import ITEMSIZE, merge, plan_shards, resume, shard_bytes, write_shard

    key = {"tokens_sha256": rows.sha256, "weights_fingerprint": target.weights_fingerprint,
           "config_sha256": target.config_sha256, "layers": list(layers), "dtype": hp.dtype,
           "source": source["format"], "final_state": final_state, "shard_max_mb": hp.shard_max_mb}
    fields = {"mode": "offline", "tokens_sha256": rows.sha256, "model": target.identity,
              "tokenizer_fingerprint": target.tokenizer_fingerprint, "dtype": hp.dtype,
              "layers": layer_names(layers, target.num_layers), "final_state": final_state,
              "feature_bytes_per_token": 4 * target.hidden_size * ITEMSIZE[hp.dtype], "source": source}
    plans = plan_shards(rows.lengths, rows.prompt_ids, target.hidden_size, hp.dtype, hp.shard_max_mb, hp.batch_tokens)
    resumed = resume(out, plans, rows, key)
    for plan in plans:
        if plan.name not in resumed.trusted:
            write_shard(out, plan, shard_bytes(rows, plan, {i: features(i) for i in plan.rows}), key)
    return merge(out, plans, rows, key, fields), len(resumed.trusted)


# ------------------------------------------------------------ CLI
