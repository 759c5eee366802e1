"""Segments -> token ids: the reconstruction hot path.

All text segments of the whole batch go through ONE `encode_ordinary_batch` call (the tokenizer's
Rust/tiktoken core, special-token parsing off); special tokens are inserted by the contract's ids.
Encoding text segments separately is exact because the tokenizers split at every special token
(docs/tokenizers.md); adjacent text must already be merged (templates render canonical segments).

`Pieces` is the batch form reconstruction uses: each distinct text is encoded once (role headers,
the generation prefix, a shared system prompt or tool declaration repeat on every row), a row is
a plan of piece numbers, and its ids are its pieces joined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from draftgate.templates.base import Segment, Special, Text


class OrdinaryEncoder(Protocol):
    def encode_ordinary_batch(self, texts: list[str]) -> list[list[int]]: ...


class MissingSpecialError(KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class Encoded:
    ids: list[int]
    # One [start, end) per segment, in order: specials span one id, text spans what it encoded to.
    # Reconstruction checks that no special id sits inside a text span.
    spans: tuple[tuple[int, int], ...]


class Pieces:
    """Distinct texts of a batch and the contract's specials, as numbered id lists.

    Numbers below `n_special` are specials (a one-id piece each); the rest are texts, in the
    order `plan` first met them. Use: `plan` every row, `encode` once, then `ids(plan)`.
    """

    def __init__(self, special_ids: Mapping[str, int]):
        self.special_ids = special_ids
        self._special = {name: k for k, name in enumerate(special_ids)}
        self.n_special = len(self._special)
        self.pieces: list[list[int]] = [[i] for i in special_ids.values()]
        self.texts: list[str] = []
        self._text: dict[str, int] = {}
        self._encoded = False

    def plan(self, segments: Sequence[Segment], row: object = "?") -> list[int]:
        plan = []
        text, special = self._text, self._special
        for s in segments:
            kind = type(s)
            if kind is Text:
                k = text.get(s.text)
                if k is None:
                    if self._encoded:
                        raise RuntimeError("Pieces: a new text was planned after encode(); plan every row first")
                    k = text[s.text] = self.n_special + len(self.texts)
                    self.texts.append(s.text)
            elif kind is Special:
                k = special.get(s.name)
                if k is None:
                    raise _missing(s.name, row, self.special_ids)
            else:
                raise TypeError(f"row {row}: segment {s!r} is neither Text nor Special")
            plan.append(k)
        return plan

    def encode(self, tok: OrdinaryEncoder) -> None:
        if self._encoded:
            raise RuntimeError("Pieces.encode() runs once per batch")
        self._encoded = True
        if self.texts:
            out = tok.encode_ordinary_batch(self.texts)
            if len(out) != len(self.texts):
                raise RuntimeError(f"encode_ordinary_batch returned {len(out)} rows for {len(self.texts)} texts")
            self.pieces.extend(out)

    def ids(self, plan: Sequence[int]) -> list[int]:
        # A loop of list += (memcpy of each piece) is 5x quicker than list(chain(...)).
        ids: list[int] = []
        parts = self.pieces
        for k in plan:
            ids += parts[k]
        return ids


def _missing(name: str, row: object, special_ids: Mapping[str, int]) -> MissingSpecialError:
    return MissingSpecialError(
        f"special token {name!r} (row {row}) has no id in the contract's ids "
        f"(have: {', '.join(sorted(special_ids)) or 'none'}); resolve every name in "
        "template.special_names with the tokenizer contract and pass its ids")


def encode_segments_spans(tok: OrdinaryEncoder, batch: Sequence[Sequence[Segment]],
                          special_ids: Mapping[str, int]) -> list[Encoded]:
    texts = [s.text for row in batch for s in row if type(s) is Text]
    pieces = iter(tok.encode_ordinary_batch(texts) if texts else ())
    out = []
    for r, row in enumerate(batch):
        ids: list[int] = []
        spans = []
        for s in row:
            start = len(ids)
            if type(s) is Text:
                ids.extend(next(pieces))
            elif type(s) is Special:
                sid = special_ids.get(s.name)
                if sid is None:
                    raise _missing(s.name, r, special_ids)
                ids.append(sid)
            else:
                raise TypeError(f"row {r}: segment {s!r} is neither Text nor Special")
            spans.append((start, len(ids)))
        out.append(Encoded(ids, tuple(spans)))
    return out


def encode_segments(tok: OrdinaryEncoder, batch: Sequence[Sequence[Segment]],
                    special_ids: Mapping[str, int]) -> list[list[int]]:
    return [e.ids for e in encode_segments_spans(tok, batch, special_ids)]
