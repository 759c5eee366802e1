"""The draft vocabulary: which target tokens the drafter's LM head can propose.

Counted over the training rows' completion tokens (the loss mask), the `size` most frequent ids
ranked by (-count, id), then sorted ascending; when fewer distinct ids exist the map is padded
with unseen ids in ascending order, so its size is always `size` (docs/drafter.md, "Draft
vocabulary"). `d2t[d]` is an offset (target id = d + d2t[d]) and `t2d` a mask over the target
vocabulary, the names and meanings SGLang and vLLM load.

A map is stored with the sha256 of the data it was built from; `require_same` refuses a warm
start or resume whose map came from other data, naming both hashes. A silently rebuilt map is
how acceptance collapsed without any metric showing it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from draftgate.io import file_sha256

FORMAT = "draftgate.vocab/1"


class VocabError(ValueError):
    """A draft vocabulary that does not fit the data or the checkpoint it meets."""


@dataclass(frozen=True)
class VocabMap:
    draft_ids: np.ndarray          # int64 [size], ascending target ids
    target_vocab_size: int
    data_sha256: str               # the data it was built from (tokens.parquet bytes)
    selection: str                 # which rows counted, e.g. "split in [train]"
    seen: int                      # distinct ids that occurred under the loss mask
    counted_tokens: int            # loss-masked tokens counted

    @property
    def size(self) -> int:
        return int(self.draft_ids.shape[0])

    @property
    def d2t(self) -> np.ndarray:
        """Offsets: target id = draft id + d2t[draft id]."""
        return self.draft_ids - np.arange(self.size, dtype=np.int64)

    @property
    def t2d(self) -> np.ndarray:
        mask = np.zeros(self.target_vocab_size, dtype=bool)
        mask[self.draft_ids] = True
        return mask

    @property
    def map_sha256(self) -> str:
        """The map's content: equal maps hash equal whatever data produced them."""
        h = hashlib.sha256()
        h.update(f"{self.target_vocab_size}\0".encode())
        h.update(np.ascontiguousarray(self.draft_ids, dtype="<i8").tobytes())
        return h.hexdigest()

    def describe(self) -> dict:
        return {"format": FORMAT, "size": self.size, "target_vocab_size": self.target_vocab_size,
                "data_sha256": self.data_sha256, "selection": self.selection, "seen": self.seen,
                "counted_tokens": self.counted_tokens, "map_sha256": self.map_sha256}


def count_tokens(rows: Iterable[tuple[np.ndarray, np.ndarray]], vocab_size: int) -> np.ndarray:
    """Counts of each target id under the loss mask, over (input_ids, loss_mask) rows."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids, mask in rows:
        ids = np.asarray(ids, dtype=np.int64)
        picked = ids[np.asarray(mask).astype(bool)]
        if picked.size and (picked.min() < 0 or picked.max() >= vocab_size):
            bad = int(picked[(picked < 0) | (picked >= vocab_size)][0])
            raise VocabError(f"token id {bad} is outside the target vocabulary (size {vocab_size}); "
                             "the features were made with another tokenizer or model")
        counts += np.bincount(picked, minlength=vocab_size)
    return counts


def build_vocab_map(counts: np.ndarray, size: int, data_sha256: str, selection: str = "") -> VocabMap:
    """Top `size` ids by (-count, id), ascending; padded with the smallest unseen ids."""
    counts = np.asarray(counts, dtype=np.int64)
    vocab = counts.shape[0]
    if not 1 <= size <= vocab:
        raise VocabError(f"draft_vocab_size {size} must be between 1 and the target vocabulary ({vocab})")
    seen_ids = np.flatnonzero(counts > 0)
    # lexsort: last key is primary. Primary -count (most frequent first), then id (smaller first).
    order = seen_ids[np.lexsort((seen_ids, -counts[seen_ids]))]
    chosen = order[:size]
    if chosen.size < size:
        unseen = np.flatnonzero(counts == 0)[: size - chosen.size]
        chosen = np.concatenate([chosen, unseen])
    return VocabMap(draft_ids=np.sort(chosen).astype(np.int64), target_vocab_size=int(vocab),
                    data_sha256=data_sha256, selection=selection, seen=int(seen_ids.size),
                    counted_tokens=int(counts.sum()))


def from_d2t(d2t: np.ndarray, target_vocab_size: int, data_sha256: str = "", selection: str = "") -> VocabMap:
    d2t = np.asarray(d2t, dtype=np.int64)
    ids = d2t + np.arange(d2t.shape[0], dtype=np.int64)
    if d2t.ndim != 1 or (np.diff(ids) <= 0).any() or ids.min() < 0 or ids.max() >= target_vocab_size:
        raise VocabError("d2t does not describe ascending, distinct target ids inside the vocabulary")
    return VocabMap(draft_ids=ids, target_vocab_size=int(target_vocab_size), data_sha256=data_sha256,
                    selection=selection, seen=-1, counted_tokens=-1)


def require_same(stored: VocabMap, current: VocabMap, what: str) -> None:
    """A warm start or resume must use the map the current data gives; never rebuild silently."""
    if stored.map_sha256 == current.map_sha256 and stored.target_vocab_size == current.target_vocab_size:
        return
    raise VocabError(
        f"{what} was trained with a draft vocabulary built from data sha256 {stored.data_sha256} "
        f"(map {stored.map_sha256[:16]}), but the current data (sha256 {current.data_sha256}) gives "
        f"map {current.map_sha256[:16]}: a drafter's LM head rows only mean something under the map it "
        "was trained with. Start fresh (delete the checkpoint, or unset drafter.init_from), or train "
        "on the data that map came from.")


def save(vmap: VocabMap, path: str | Path) -> None:
    """safetensors: d2t, t2d (the engines' tensors) and the provenance as metadata."""
    import json

    from draftgate.io import write_safetensors

    # Eight metadata keys: safetensors' own writer orders them per process (draftgate/io.py).
    meta = {k: json.dumps(v) for k, v in vmap.describe().items()}
    write_safetensors(path, {"d2t": vmap.d2t, "t2d": vmap.t2d}, meta)


def load(path: str | Path) -> VocabMap:
    import json

    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
        d2t = f.get_tensor("d2t")
    if meta.get("format") != FORMAT:
        raise VocabError(f"{path}: not a draftgate vocabulary map (format {meta.get('format')!r})")
    v = from_d2t(d2t, meta["target_vocab_size"], meta["data_sha256"], meta.get("selection", ""))
    return VocabMap(draft_ids=v.draft_ids, target_vocab_size=v.target_vocab_size, data_sha256=v.data_sha256,
                    selection=v.selection, seen=meta.get("seen", -1), counted_tokens=meta.get("counted_tokens", -1))


def training_rows(tokens_path: str | Path, splits: list[str]) -> tuple[list[str], list[tuple[np.ndarray, np.ndarray]]]:
    """Prompt ids and (input_ids, loss_mask) of the kept rows whose split is in `splits`."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(tokens_path, columns=["prompt_id", "split", "quarantine_reason", "input_ids", "loss_mask"])
    keep = pc.and_(pc.is_null(t.column("quarantine_reason")), pc.is_in(t.column("split"), value_set=_pa_strings(splits)))
    t = t.filter(keep)
    ids = t.column("input_ids").to_pylist()
    masks = t.column("loss_mask").to_pylist()
    rows = [(np.asarray(i, dtype=np.int64), np.asarray(m, dtype=np.int8)) for i, m in zip(ids, masks)]
    return t.column("prompt_id").to_pylist(), rows


def _pa_strings(values: list[str]):
    import pyarrow as pa

    return pa.array(list(values), type=pa.string())


def vocab_from_tokens(tokens_path: str | Path, splits: list[str], size: int,
                      vocab_size: int) -> tuple[VocabMap, list[str], np.ndarray]:
    """The map the training rows of a tokens table give, with its prompt ids and counts."""
    prompt_ids, rows = training_rows(tokens_path, splits)
    if not prompt_ids:
        raise VocabError(f"{tokens_path}: no kept rows in splits {splits}; check drafter.splits")
    counts = count_tokens(rows, vocab_size)
    selection = f"kept rows, split in {sorted(splits)}"
    return build_vocab_map(counts, size, file_sha256(tokens_path), selection), prompt_ids, counts


def coverage(vmap: VocabMap, counts: np.ndarray) -> float:
    """Share of the counted tokens the draft vocabulary holds (the rest it can never propose)."""
    total = int(counts.sum())
    return float(counts[vmap.draft_ids].sum() / total) if total else 0.0
