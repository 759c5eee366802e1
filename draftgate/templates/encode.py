"""Segments -> token ids: the reconstruction hot path.

All text segments of the whole batch go through ONE `encode_ordinary_batch` call (the tokenizer's
Rust/tiktoken core, special-token parsing off); special tokens are inserted by the contract's ids.
Encoding text segments separately is exact because the tokenizers split at every special token
(FACTS.md); adjacent text must already be merged (templates render canonical segments).
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
                    raise MissingSpecialError(
                        f"special token {s.name!r} (row {r}) has no id in the contract's ids "
                        f"(have: {', '.join(sorted(special_ids)) or 'none'}); resolve every name in "
                        "template.special_names with the tokenizer contract and pass its ids")
                ids.append(sid)
            else:
                raise TypeError(f"row {r}: segment {s!r} is neither Text nor Special")
            spans.append((start, len(ids)))
        out.append(Encoded(ids, tuple(spans)))
    return out


def encode_segments(tok: OrdinaryEncoder, batch: Sequence[Sequence[Segment]],
                    special_ids: Mapping[str, int]) -> list[list[int]]:
    return [e.ids for e in encode_segments_spans(tok, batch, special_ids)]
