"""Held-out contamination: prompts of the heldout split that are (near) duplicates of train prompts.

The split is by content hash of the whole prompt (prompts.split_of), so the same user question
under another system prompt, with other case or trailing whitespace, lands in both splits and
inflates the acceptance eval measures. Two measures, both reported with examples in
metrics/prompts.json (`contamination`):

- exact: the heldout prompt's last user turn, normalised (NFKC, casefold, whitespace runs to one
  space, stripped), equals a train prompt's;
- near: MinHash over the conversation's text (every non-system turn's content, normalised the same
  way, as character 5-grams; 128 permutations) and datasketch's LSH at
  prompts.near_duplicate_threshold estimated Jaccard similarity.

A heldout prompt counts once whichever measure finds it; the rate is over heldout prompts. The
prompts gate recounts the exact measure itself from the messages (expectations/prompts.json);
`prompts.split_by: last_user` makes the split by the normalised last user turn so that exact
duplicates land on one side (the default, `prompt`, keeps every existing split).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Iterable

SHINGLE = 5            # characters per shingle: language-agnostic (CJK has no spaces)
NUM_PERM = 128
EXAMPLES = 5


def normalised(text: str | None) -> str:
    return " ".join(unicodedata.normalize("NFKC", text or "").casefold().split())


def last_user(messages: list[dict]) -> str:
    """The normalised content of the last user turn ("" when there is none)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            return normalised(m.get("content") if isinstance(m.get("content"), str) else None)
    return ""


def group_key(messages: list[dict]) -> str:
    """The split key under prompts.split_by: last_user (a sha256, like a prompt id)."""
    return hashlib.sha256(last_user(messages).encode("utf-8")).hexdigest()


def conversation_text(messages: list[dict]) -> str:
    return "\n".join(normalised(m.get("content")) for m in messages
                     if m.get("role") != "system" and isinstance(m.get("content"), str))


@dataclass
class Contamination:
    heldout: int = 0
    exact: int = 0                 # heldout prompts whose last user turn a train prompt has
    near: int = 0                  # heldout prompts LSH pairs with a train prompt (exact ones too)
    contaminated: int = 0          # either
    examples: list[dict] = field(default_factory=list)

    def to_dict(self, threshold: float) -> dict[str, Any]:
        return {"heldout": self.heldout, "exact_last_user": self.exact, "near_duplicate": self.near,
                "contaminated": self.contaminated,
                "rate": round(self.contaminated / self.heldout, 6) if self.heldout else 0.0,
                "near_duplicate_threshold": threshold, "examples": self.examples}


def contamination(rows: Iterable[dict], threshold: float) -> Contamination:
    """`rows`: prompt_id, split, messages (JSON text). Memory: one MinHash per prompt (~1 KB)."""
    from datasketch import MinHash, MinHashLSH

    train_last: dict[str, str] = {}
    heldout: list[tuple[str, str, Any]] = []
    lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
    for r in rows:
        messages = json.loads(r["messages"])
        text = conversation_text(messages)
        mh = MinHash(num_perm=NUM_PERM)
        mh.update_batch([s.encode("utf-8") for s in _shingles(text)])
        if r["split"] == "train":
            train_last.setdefault(last_user(messages), r["prompt_id"])
            lsh.insert(r["prompt_id"], mh)
        else:
            heldout.append((r["prompt_id"], last_user(messages), mh))
    out = Contamination(heldout=len(heldout))
    for pid, lu, mh in heldout:
        exact = train_last.get(lu) if lu else None
        near = sorted(lsh.query(mh))
        out.exact += exact is not None
        out.near += bool(near)
        if exact is not None or near:
            out.contaminated += 1
            if len(out.examples) < EXAMPLES:
                out.examples.append({"heldout": pid, "train": exact or near[0],
                                     "kind": "exact_last_user" if exact is not None else "near_duplicate"})
    return out


def _shingles(text: str) -> set[str]:
    if len(text) <= SHINGLE:
        return {text}
    return {text[i:i + SHINGLE] for i in range(len(text) - SHINGLE + 1)}
