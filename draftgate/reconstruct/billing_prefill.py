"""Provider prompt prefills: text a provider appends to the assistant turn's generation prompt.

Some providers serving a thinking model open the think block themselves: the prompt the model
sees (and the bill's prompt tokens) ends with `<think>` (or `<think>\\n`), and the completion the
API returns starts after it (its reasoning text may begin with the newline the model wrote next).
The template as code renders that opener at the start of the completion, so without a rule
such a row is one or two tokens long on the completion side and short on the prompt side: a
constant prompt offset (reconstruct.billing.prompt) would absorb the prompt half and leave the
completion half failing, which is how the two are told apart.

`reconstruct.billing.prefill: {provider: text}` declares it (docs/provider-rules.md has the
evidence format). The text is resolved into ids by name: every special name the contract
verified becomes its contract id, the rest is encoded as ordinary text, so no id is written
here. The reconstruct stage (core.py) moves those ids from the start of the rendered completion
to the end of the prompt; a row whose rendered completion does not start with them is
quarantined as `prefill_absent` (the declaration does not fit that row: thinking off, or a
template that opens the block itself). The tokens gate needs nothing of its own: it recomputes
both billed lengths from the ids (prompt = input_ids minus completion_ids), so a wrong or
missing declaration fails the prompt and completion billing checks there.
"""

from __future__ import annotations

from typing import Any, Mapping

from draftgate.reconstruct.billing import provider_key
from draftgate.reconstruct.inputs import InputError


class PrefillError(InputError):
    """A declared prefill that cannot be resolved into ids (message names the param and the fix)."""


def resolve(tok: Any, special_ids: Mapping[str, int], table: Mapping[str, str] | None) -> dict[str, tuple[int, ...]]:
    """Per provider (lower-cased): the ids of its declared prefill; {} when none is declared."""
    out = {}
    for provider, text in (table or {}).items():
        if not isinstance(text, str) or not text:
            raise PrefillError(f"params.yaml reconstruct.billing.prefill.{provider} is {text!r}; give the "
                               "text the provider prefills (e.g. the think opener) or drop the entry")
        ids = _ids(tok, special_ids, text)
        if not any(i in special_ids.values() for i in ids):
            # A prefill of plain text is a request rule (it changes what the model reads), not a
            # billing fact; every prefill recorded so far opens a think block.
            raise PrefillError(f"params.yaml reconstruct.billing.prefill.{provider} ({text!r}) holds no special "
                               f"token the contract verified ({', '.join(sorted(special_ids))}); a prefill "
                               "opens the think block: name its token")
        out[provider_key(provider)] = tuple(ids)
    return out


def _ids(tok: Any, special_ids: Mapping[str, int], text: str) -> list[int]:
    names = sorted(special_ids, key=len, reverse=True)   # the longest name first: no prefix wins
    ids: list[int] = []
    plain = ""
    i = 0
    while i < len(text):
        name = next((n for n in names if text.startswith(n, i)), None)
        if name is None:
            plain += text[i]
            i += 1
            continue
        if plain:
            ids += tok.encode_ordinary(plain)
            plain = ""
        ids.append(special_ids[name])
        i += len(name)
    if plain:
        ids += tok.encode_ordinary(plain)
    return ids


def split(prompt_ids: list[int], completion_ids: list[int], prefill: tuple[int, ...]) -> tuple[list[int], list[int]] | None:
    """(prompt + prefill, completion without it), or None where the completion does not start with it."""
    k = len(prefill)
    if completion_ids[:k] != list(prefill):
        return None
    return prompt_ids + list(prefill), completion_ids[k:]
