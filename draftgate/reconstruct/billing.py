"""Reconcile reconstructed completion lengths with what the backend billed.

Backends disagree on whether the final end-of-turn token counts as a completion token. That is
measured per provider, never assumed: both conventions are scored on the provider's rows, the
one that agrees more often is that provider's convention, and every row's residual is taken
under it. `billing_delta` itself stays the plain `n_completion - billed_completion_tokens`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable

COUNTS_END, EXCLUDES_END = "counts_end", "excludes_end"


@dataclass(frozen=True)
class BillingRow:
    provider: str | None
    n_completion: int
    billed: int | None
    ends_with_eos: bool


@dataclass(frozen=True)
class Convention:
    rows: int                   # rows with a billed count
    agree_counts_end: float     # share of rows where n_completion == billed
    agree_excludes_end: float   # share where n_completion - (1 if it ends with the end token) == billed
    convention: str             # the better of the two
    # False when both conventions score the same (e.g. every row truncated): then the choice
    # (counts_end) is a default, not a measurement.
    determined: bool


def delta(n_completion: int, billed: int | None) -> int | None:
    return None if billed is None else n_completion - billed


def residual(row: BillingRow, convention: str) -> int | None:
    if row.billed is None:
        return None
    counted = row.n_completion - (1 if convention == EXCLUDES_END and row.ends_with_eos else 0)
    return counted - row.billed


def measure(rows: Iterable[BillingRow]) -> dict[str, Convention]:
    by_provider: dict[str, list[BillingRow]] = defaultdict(list)
    for r in rows:
        if r.billed is not None:
            by_provider[r.provider or "unknown"].append(r)
    out = {}
    for provider, rs in sorted(by_provider.items()):
        a = sum(residual(r, COUNTS_END) == 0 for r in rs) / len(rs)
        b = sum(residual(r, EXCLUDES_END) == 0 for r in rs) / len(rs)
        out[provider] = Convention(len(rs), a, b, EXCLUDES_END if b > a else COUNTS_END, a != b)
    return out


def summary(rows: list[BillingRow], conventions: dict[str, Convention]) -> dict:
    """Aggregate figures over rows that have a billed count (the tokens gate reads the same)."""
    billed = [r for r in rows if r.billed is not None]
    res = [residual(r, conventions[r.provider or "unknown"].convention) for r in billed]
    total = sum(r.billed for r in billed)
    return {
        "rows_billed": len(billed),
        "row_agreement": (sum(x == 0 for x in res) / len(res)) if res else None,
        "billed_total": total,
        "residual_total": sum(res),
        # |sum of residuals| / sum billed: the seed run's "within 0.04% in aggregate".
        "aggregate_delta_rate": (abs(sum(res)) / total) if total else None,
        "by_provider": {p: asdict(c) for p, c in conventions.items()},
    }
