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


def window(pseg: list, cseg: list) -> str | None:
    """The boundary string to encode for one row: the prompt's last text and the completion's
    head; None when a special token stands between them (nothing can merge across it)."""
    if not pseg or type(pseg[-1]) is not Text:
        return None
    h = _head(cseg)
    return pseg[-1].text + h if h else None


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


def literal_in_prompt(pseg: list, literal: Any) -> str | None:
    """Why the engine would read the prompt differently: its text holds an added token's string."""
    if literal is not None:
        for s in pseg:
            hit = type(s) is Text and literal.search(s.text)
            if hit:
                return f"prompt text holds {hit.group()!r}, which the engine parses as one added token"
    return None


def boundary_merge(prompt_ids: list[int], last_len: int, engine: list[int]) -> str | None:
    """Why the engine's ids of the boundary window would not start with the prompt's last text's
    ids (`last_len` of them, at the end of `prompt_ids`), or None."""
    start = len(prompt_ids) - last_len
    tail = prompt_ids[start:]
    if engine[:len(tail)] == tail:
        return None
    j = first_difference(tail, engine)
    return (f"the prompt's last text merges with the completion: ids from {start + j} are "
            f"{engine[j:j + 4]} in the whole string, {tail[j:j + 4]} in the prompt")


@functools.lru_cache(maxsize=8)
def added_tokens_pattern(tok: Any) -> Any:
    # Every added token's text, longest first (one regex search per prompt text segment).
    import re

    names = sorted({t.content for t in tok.hf.backend_tokenizer.get_added_tokens_decoder().values()},
                   key=len, reverse=True)
    return re.compile("|".join(map(re.escape, names))) if names else None
