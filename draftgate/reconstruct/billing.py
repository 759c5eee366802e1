"""Reconcile reconstructed lengths with what the backend billed: completions and prompts.

The API bills the model's native token count, so our ids' lengths against the bill is a check
that needs no ground truth. Backends differ in what they count:
- completion: whether the final end-of-turn token is billed (`counts_end` / `excludes_end`);
- prompt: a constant offset from the rendered prompt's ids (a BOS the template does not write,
  ...): billed = len(prompt ids) + offset.

Each provider's convention is DECLARED in params (reconstruct.billing) or LEARNED from rows whose
ids are known exact (completion: truth or logprob ids; prompt: the backend returned the prompt
ids and they equal ours), never fitted on the rows being graded: a convention chosen by best fit
would absorb a systematic off-by-one. The best fit on all rows is still computed and reported
beside it, and a disagreement is a finding (the tokens gate recomputes and fails on it).
`billing_delta` stays the plain `n_completion - billed_completion_tokens`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

COUNTS_END, EXCLUDES_END, LEARN = "counts_end", "excludes_end", "learn"


@dataclass(frozen=True)
class BillingRow:
    provider: str | None
    n_completion: int
    billed: int | None
    ends_with_eos: bool
    exact: bool = False               # completion ids known exact (truth or logprobs)
    prompt_len: int | None = None
    billed_prompt: int | None = None
    prompt_exact: bool = False        # the backend's own prompt ids equal ours


@dataclass(frozen=True)
class Convention:
    """One provider's completion and prompt conventions, where they came from, and the best fit."""
    provider: str
    rows: int                          # rows with a billed completion count
    completion: str | None             # counts_end | excludes_end | None (unknown)
    completion_source: str             # declared | learned | unknown
    completion_learned_from: int       # exact rows it was learned from
    agree_counts_end: float | None     # share of rows agreeing under each convention
    agree_excludes_end: float | None
    completion_best_fit: str | None    # None when both conventions score the same
    prompt_rows: int
    prompt_offset: int | None
    prompt_source: str
    prompt_learned_from: int
    prompt_best_fit: int | None        # the most common billed - len(prompt ids)
    prompt_best_fit_share: float | None

    @property
    def completion_agrees(self) -> bool | None:
        if self.completion is None or self.completion_best_fit is None:
            return None
        return self.completion == self.completion_best_fit

    @property
    def prompt_agrees(self) -> bool | None:
        if self.prompt_offset is None or self.prompt_best_fit is None:
            return None
        return self.prompt_offset == self.prompt_best_fit

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "completion_agrees": self.completion_agrees,
                "prompt_agrees": self.prompt_agrees}


def provider_key(provider: str | None) -> str:
    return (provider or "unknown").lower()


def declared(table: Mapping[str, Any], provider: str | None) -> Any:
    """The params entry for a provider: its own (case-insensitive), else "*", else learn."""
    low = {k.lower(): v for k, v in table.items()}
    return low.get(provider_key(provider), low.get("*", LEARN))


def delta(n_completion: int, billed: int | None) -> int | None:
    return None if billed is None else n_completion - billed


def residual(row: BillingRow, convention: str | None) -> int | None:
    if row.billed is None or convention is None:
        return None
    counted = row.n_completion - (1 if convention == EXCLUDES_END and row.ends_with_eos else 0)
    return counted - row.billed


def prompt_residual(row: BillingRow, offset: int | None) -> int | None:
    if row.billed_prompt is None or row.prompt_len is None or offset is None:
        return None
    return row.prompt_len + offset - row.billed_prompt


def settle(rows: Iterable[BillingRow], completion: Mapping[str, str],
           prompt: Mapping[str, Any]) -> dict[str, Convention]:
    """Per provider (lower-cased): the conventions to grade with, from params or exact rows."""
    by_provider: dict[str, list[BillingRow]] = defaultdict(list)
    for r in rows:
        by_provider[provider_key(r.provider)].append(r)
    out = {}
    for p, rs in sorted(by_provider.items()):
        billed = [r for r in rs if r.billed is not None]
        agree = {c: _share(billed, lambda r, c=c: residual(r, c) == 0) for c in (COUNTS_END, EXCLUDES_END)}
        best = _better(agree[COUNTS_END], agree[EXCLUDES_END])
        exact = [r for r in billed if r.exact]
        conv, src = declared(completion, p), "declared"
        if conv == LEARN:
            learned = {c: _share(exact, lambda r, c=c: residual(r, c) == 0) for c in (COUNTS_END, EXCLUDES_END)}
            conv = _better(learned[COUNTS_END], learned[EXCLUDES_END])
            src = "learned" if conv else "unknown"

        pbilled = [r for r in rs if r.billed_prompt is not None and r.prompt_len is not None]
        offsets = Counter(r.billed_prompt - r.prompt_len for r in pbilled)
        top = offsets.most_common(2)
        pbest = top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None
        off, psrc = declared(prompt, p), "declared"
        pexact = [r for r in pbilled if r.prompt_exact]
        if off == LEARN:
            learned_off = Counter(r.billed_prompt - r.prompt_len for r in pexact).most_common(1)
            off = learned_off[0][0] if learned_off else None
            psrc = "learned" if off is not None else "unknown"
        out[p] = Convention(
            provider=p, rows=len(billed), completion=conv, completion_source=src,
            completion_learned_from=len(exact) if src == "learned" else 0,
            agree_counts_end=agree[COUNTS_END], agree_excludes_end=agree[EXCLUDES_END],
            completion_best_fit=best, prompt_rows=len(pbilled), prompt_offset=off, prompt_source=psrc,
            prompt_learned_from=len(pexact) if psrc == "learned" else 0, prompt_best_fit=pbest,
            prompt_best_fit_share=(offsets[pbest] / len(pbilled)) if pbest is not None else None)
    return out


def summary(rows: list[BillingRow], conventions: dict[str, Convention]) -> dict:
    """Aggregate figures over kept rows with a billed count (the tokens gate recomputes them)."""
    def conv(r: BillingRow) -> Convention:
        return conventions[provider_key(r.provider)]

    res = [x for x in (residual(r, conv(r).completion) for r in rows if r.billed is not None) if x is not None]
    billed = sum(r.billed for r in rows if r.billed is not None and conv(r).completion is not None)
    pres = [x for x in (prompt_residual(r, conv(r).prompt_offset) for r in rows) if x is not None]
    pbilled = sum(r.billed_prompt for r in rows
                  if r.billed_prompt is not None and r.prompt_len is not None and conv(r).prompt_offset is not None)
    return {
        "completion": _figures(res, billed),
        "prompt": _figures(pres, pbilled),
        # Providers whose convention is neither declared nor learnable: their rows are not
        # graded, and the tokens gate fails until reconstruct.billing declares them.
        "unknown_completion": sorted(p for p, c in conventions.items() if c.rows and c.completion is None),
        "unknown_prompt": sorted(p for p, c in conventions.items() if c.prompt_rows and c.prompt_offset is None),
        "disagreements": sorted(
            [f"{p}: completion {c.completion} ({c.completion_source}) but best fit {c.completion_best_fit}"
             for p, c in conventions.items() if c.completion_agrees is False]
            + [f"{p}: prompt offset {c.prompt_offset} ({c.prompt_source}) but best fit {c.prompt_best_fit}"
               for p, c in conventions.items() if c.prompt_agrees is False]),
        "by_provider": {p: c.to_dict() for p, c in conventions.items()},
    }


def _figures(res: list[int], billed: int) -> dict:
    return {
        "rows": len(res),
        "row_agreement": (sum(x == 0 for x in res) / len(res)) if res else None,
        "billed_total": billed,
        "residual_total": sum(res),
        # |sum of residuals| / sum billed: the seed run's "within 0.04% in aggregate".
        "aggregate_delta_rate": (abs(sum(res)) / billed) if billed else None,
    }


def _share(rows: list[BillingRow], pred: Any) -> float | None:
    return (sum(bool(pred(r)) for r in rows) / len(rows)) if rows else None


def _better(a: float | None, b: float | None) -> str | None:
    # None when nothing was measured or both score the same (e.g. every row truncated).
    if a is None or b is None or a == b:
        return None
    return COUNTS_END if a > b else EXCLUDES_END
