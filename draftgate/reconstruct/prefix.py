"""Prefix stability: would a serving engine, encoding the whole conversation as one string,
produce our prompt ids as its prefix?

Special tokens split the text (the tokenizer contract checks it), so only two things can change
the prompt's ids: an added token's text inside the prompt's text (the engine parses it as the
token), and a merge across the prompt/completion boundary, in which only the prompt's last text
segment and the completion's first can take part. Both are checked in one batch call, without
re-encoding whole conversations (tests check the verdict against the whole-string encode).
"""

from __future__ import annotations

import functools
from typing import Any

from draftgate.reconstruct.classify import first_difference
from draftgate.templates.base import Text

# The completion text before its first special token that the prefix check re-encodes with the
# prompt. A boundary merge involves only the pre-token chunk that straddles the boundary, so a
# few hundred characters see every merge the full string would (a single pre-token longer than
# this right at the boundary is the one case it could miss).
HEAD_CHARS = 256


def windows(work: list[tuple[list, list]]) -> tuple[list[str], dict[int, int]]:
    """The boundary strings to encode, and row -> its position among them (rows with one)."""
    texts, at = [], {}
    for k, (pseg, cseg) in enumerate(work):
        h = _head(cseg)
        if h and pseg and type(pseg[-1]) is Text:
            at[k] = len(texts)
            texts.append(pseg[-1].text + h)
    return texts, at


def _head(cseg: list) -> str:
    head = []
    for s in cseg:
        if type(s) is not Text:
            break
        head.append(s.text)
    return "".join(head)[:HEAD_CHARS]


def encode_with_specials(tok: Any, texts: list[str]) -> list[list[int]]:
    # What a serving engine does with a rendered chat string: added tokens parsed, no BOS/EOS.
    return tok.encode_batch(texts) if texts else []


def unstable(pseg: list, pe: Any, engine: list[int] | None, literal: Any) -> str | None:
    """Why the engine's encoding of the conversation would not start with our prompt ids, or None."""
    if literal is not None:
        for s in pseg:
            hit = type(s) is Text and literal.search(s.text)
            if hit:
                return f"prompt text holds {hit.group()!r}, which the engine parses as one added token"
    if engine is not None:
        start = pe.spans[-1][0]
        tail = pe.ids[start:]
        if engine[:len(tail)] != tail:
            j = first_difference(tail, engine)
            return (f"the prompt's last text merges with the completion: ids from {start + j} are "
                    f"{engine[j:j + 4]} in the whole string, {tail[j:j + 4]} in the prompt")
    return None


@functools.lru_cache(maxsize=8)
def added_tokens_pattern(tok: Any) -> Any:
    # Every added token's text, longest first (one regex search per prompt text segment).
    import re

    names = sorted({t.content for t in tok.hf.backend_tokenizer.get_added_tokens_decoder().values()},
                   key=len, reverse=True)
    return re.compile("|".join(map(re.escape, names))) if names else None
