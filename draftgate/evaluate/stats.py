"""Acceptance figures over verify steps, and a bootstrap interval over prompts (docs/evaluation.md).

Acceptance length here is SGLang's: tokens emitted per target verify forward, the bonus
(correction) token included; the prefill's first token is neither a verify step nor counted.
vLLM's `1 + accepted / drafts` is reported beside it (it skips steps that drafted nothing, which
matters for the n-gram proposer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class PromptSteps:
    """One prompt's verify steps: tokens drafted, accepted, emitted (after the stop cut) per step."""
    drafted: Sequence[int]
    accepted: Sequence[int]
    emitted: Sequence[int]


def acceptance_length(runs: Sequence[PromptSteps]) -> float:
    """Tokens emitted / verify forwards over all prompts (a ratio of sums, not a mean of ratios)."""
    forwards = sum(len(r.emitted) for r in runs)
    if forwards == 0:
        return float("nan")
    return sum(sum(r.emitted) for r in runs) / forwards


def vllm_acceptance_length(runs: Sequence[PromptSteps]) -> float:
    """vLLM's `1 + accepted / drafts`: steps that drafted nothing are not drafts."""
    drafts = sum(1 for r in runs for d in r.drafted if d > 0)
    if drafts == 0:
        return float("nan")
    return 1.0 + sum(a for r in runs for d, a in zip(r.drafted, r.accepted) if d > 0) / drafts


def per_position(runs: Sequence[PromptSteps], k: int) -> list[float]:
    """Rate at which draft position i (1..k) is accepted, over the steps that drafted at least i.

    Position i is accepted only with every position before it, so the rates do not increase.
    """
    rates = []
    for i in range(1, k + 1):
        offered = sum(1 for r in runs for d in r.drafted if d >= i)
        taken = sum(1 for r in runs for d, a in zip(r.drafted, r.accepted) if d >= i and a >= i)
        rates.append(taken / offered if offered else float("nan"))
    return rates


def accepted_fraction(runs: Sequence[PromptSteps]) -> float:
    """Draft tokens accepted / draft tokens proposed."""
    drafted = sum(sum(r.drafted) for r in runs)
    return sum(sum(r.accepted) for r in runs) / drafted if drafted else float("nan")


def bootstrap_ci(runs: Sequence[PromptSteps], samples: int, seed: int,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the acceptance length, prompts resampled with replacement (seeded).

    Prompts, not steps, are the independent units: steps within one answer are correlated.
    """
    import numpy as np

    if not runs:
        return (float("nan"), float("nan"))
    tokens = np.array([sum(r.emitted) for r in runs], dtype=np.float64)
    forwards = np.array([len(r.emitted) for r in runs], dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(runs), size=(samples, len(runs)))
    den = forwards[picks].sum(axis=1)
    ratios = tokens[picks].sum(axis=1) / np.where(den > 0, den, np.nan)
    ratios = ratios[np.isfinite(ratios)]
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return (float(lo), float(hi))


def simulated_acceptance_length(step_accuracies: Sequence[float]) -> float:
    """SpecForge's teacher-forced estimate `sum_k prod_{i<=k} acc_i` (no bonus token): a proxy."""
    total, chain = 0.0, 1.0
    for acc in step_accuracies:
        chain *= acc
        total += chain
    return total
