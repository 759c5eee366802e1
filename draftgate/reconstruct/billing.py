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
    return settle_columns(Columns.of(rows), completion, prompt)


class Columns:
    """The billing facts of many rows as numpy arrays (a million rows cost ~40 MB, not a million
    objects). Every array has one entry per row; `*_ok` say where the nullable values exist."""

    def __init__(self, keys: list[str], codes: Any, n: Any, billed: Any, billed_ok: Any, ends: Any, exact: Any,
                 plen: Any, plen_ok: Any, bprompt: Any, bprompt_ok: Any, pexact: Any):
        # keys: the lower-cased providers; codes: each row's index into keys.
        self.keys, self.provider = list(keys), codes
        self.n, self.billed, self.billed_ok, self.ends, self.exact = n, billed, billed_ok, ends, exact
        self.plen, self.plen_ok, self.bprompt, self.bprompt_ok, self.pexact = plen, plen_ok, bprompt, bprompt_ok, pexact

    @classmethod
    def of(cls, rows: Iterable[BillingRow]) -> Columns:
        import numpy as np

        rows = list(rows)

        def ints(xs: list) -> tuple[Any, Any]:
            return (np.array([x or 0 for x in xs], dtype=np.int64), np.array([x is not None for x in xs], dtype=bool))
        billed, billed_ok = ints([r.billed for r in rows])
        plen, plen_ok = ints([r.prompt_len for r in rows])
        bprompt, bprompt_ok = ints([r.billed_prompt for r in rows])
        keys, codes = np.unique(np.array([provider_key(r.provider) for r in rows] or [""], dtype=object).astype(str),
                                return_inverse=True)
        return cls([str(k) for k in keys], codes[:len(rows)], np.array([r.n_completion for r in rows], dtype=np.int64),
                   billed, billed_ok, np.array([r.ends_with_eos for r in rows], dtype=bool),
                   np.array([r.exact for r in rows], dtype=bool), plen, plen_ok, bprompt, bprompt_ok,
                   np.array([r.prompt_exact for r in rows], dtype=bool))

    def completion_residuals(self, conventions: Mapping[str, Convention]) -> tuple[Any, Any]:
        """Per row: the residual under its provider's convention, and where there is one."""
        import numpy as np

        excl = np.array([conventions[k].completion == EXCLUDES_END if k in conventions else False
                         for k in self.keys], dtype=bool)[self.provider]
        known = np.array([k in conventions and conventions[k].completion is not None for k in self.keys],
                         dtype=bool)[self.provider]
        return self.n - (excl & self.ends) - self.billed, known & self.billed_ok

    def prompt_residuals(self, conventions: Mapping[str, Convention]) -> tuple[Any, Any]:
        import numpy as np

        off = np.array([(conventions[k].prompt_offset or 0) if k in conventions else 0 for k in self.keys],
                       dtype=np.int64)[self.provider]
        known = np.array([k in conventions and conventions[k].prompt_offset is not None for k in self.keys],
                         dtype=bool)[self.provider]
        return self.plen + off - self.bprompt, known & self.plen_ok & self.bprompt_ok


def settle_columns(c: Columns, completion: Mapping[str, str], prompt: Mapping[str, Any]) -> dict[str, Convention]:
    import numpy as np

    out = {}
    for k, p in enumerate(c.keys):
        mine = c.provider == k
        billed = mine & c.billed_ok
        counts_end = (c.n - c.billed == 0)
        excludes_end = (c.n - c.ends - c.billed == 0)
        agree = {COUNTS_END: _mean(counts_end, billed), EXCLUDES_END: _mean(excludes_end, billed)}
        best = _better(agree[COUNTS_END], agree[EXCLUDES_END])
        exact = billed & c.exact
        conv, src = declared(completion, p), "declared"
        if conv == LEARN:
            conv = _better(_mean(counts_end, exact), _mean(excludes_end, exact))
            src = "learned" if conv else "unknown"

        pbilled = mine & c.plen_ok & c.bprompt_ok
        offsets = (c.bprompt - c.plen)[pbilled]
        values, counts = np.unique(offsets, return_counts=True)
        order = np.argsort(-counts, kind="stable")
        pbest = int(values[order[0]]) if len(values) and (len(values) == 1 or counts[order[0]] > counts[order[1]]) else None
        off, psrc = declared(prompt, p), "declared"
        pexact = pbilled & c.pexact
        if off == LEARN:
            ev, ec = np.unique((c.bprompt - c.plen)[pexact], return_counts=True)
            off = int(ev[np.argmax(ec)]) if len(ev) else None
            psrc = "learned" if off is not None else "unknown"
        out[str(p)] = Convention(
            provider=str(p), rows=int(billed.sum()), completion=conv, completion_source=src,
            completion_learned_from=int(exact.sum()) if src == "learned" else 0,
            agree_counts_end=agree[COUNTS_END], agree_excludes_end=agree[EXCLUDES_END],
            completion_best_fit=best, prompt_rows=int(pbilled.sum()), prompt_offset=off, prompt_source=psrc,
            prompt_learned_from=int(pexact.sum()) if psrc == "learned" else 0, prompt_best_fit=pbest,
            prompt_best_fit_share=(float(counts[order[0]]) / int(pbilled.sum())) if pbest is not None else None)
    return out


def summary(rows: list[BillingRow], conventions: dict[str, Convention]) -> dict:
    """Aggregate figures over kept rows with a billed count (the tokens gate recomputes them)."""
    return summary_columns(Columns.of(rows), conventions)


def summary_columns(c: Columns, conventions: dict[str, Convention]) -> dict:
    res, res_ok = c.completion_residuals(conventions)
    pres, pres_ok = c.prompt_residuals(conventions)
    return {
        "completion": _figures(res[res_ok], int(c.billed[res_ok].sum())),
        "prompt": _figures(pres[pres_ok], int(c.bprompt[pres_ok].sum())),
        # Providers whose convention is neither declared nor learnable: their rows are not
        # graded, and the tokens gate fails until reconstruct.billing declares them.
        "unknown_completion": sorted(p for p, v in conventions.items() if v.rows and v.completion is None),
        "unknown_prompt": sorted(p for p, v in conventions.items() if v.prompt_rows and v.prompt_offset is None),
        "disagreements": sorted(
            [f"{p}: completion {v.completion} ({v.completion_source}) but best fit {v.completion_best_fit}"
             for p, v in conventions.items() if v.completion_agrees is False]
            + [f"{p}: prompt offset {v.prompt_offset} ({v.prompt_source}) but best fit {v.prompt_best_fit}"
               for p, v in conventions.items() if v.prompt_agrees is False]),
        "by_provider": {p: v.to_dict() for p, v in conventions.items()},
    }


def _figures(res: Any, billed: int) -> dict:
    total = int(res.sum())
    return {
        "rows": int(len(res)),
        "row_agreement": float((res == 0).mean()) if len(res) else None,
        "billed_total": billed,
        "residual_total": total,
        # |sum of residuals| / sum billed: the seed run's "within 0.04% in aggregate".
        "aggregate_delta_rate": (abs(total) / billed) if billed else None,
    }


def _mean(hit: Any, where: Any) -> float | None:
    n = int(where.sum())
    return float((hit & where).sum()) / n if n else None


def _better(a: float | None, b: float | None) -> str | None:
    # None when nothing was measured or both score the same (e.g. every row truncated).
    if a is None or b is None or a == b:
        return None
    return COUNTS_END if a > b else EXCLUDES_END
