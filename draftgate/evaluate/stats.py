"""Acceptance figures over verify steps, and a bootstrap interval over prompts (docs/evaluation.md).

Acceptance length here is SGLang's: tokens emitted per target verify forward, the bonus
(correction) token included; the prefill's first token is neither a verify step nor counted.
vLLM's `1 + accepted / drafts` is reported beside it (it skips steps that drafted nothing, which
matters for the n-gram proposer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


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


def per_position_all(runs: Sequence[PromptSteps], k: int) -> list[float]:
    """Rate at which draft position i (1..k) is accepted, over every verify step: the same
    denominator for every proposer, so an n-gram proposer that drafts on few steps is not drawn
    above a drafter that drafts on all (per_position's rates are over the steps that drafted).
    Their sum plus 1 is the acceptance length before the stop cut."""
    steps = sum(len(r.drafted) for r in runs)
    if steps == 0:
        return [float("nan")] * k
    return [sum(1 for r in runs for a in r.accepted if a >= i) / steps for i in range(1, k + 1)]


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


def arms_difference(a: Sequence[Sequence[PromptSteps]], b: Sequence[Sequence[PromptSteps]], samples: int,
                    seed: int, level: float = 0.95) -> tuple[float, float, float]:
    """(mean acceptance length of arm b's runs minus arm a's, and its percentile interval).

    An arm is several runs that differ only in a training seed; every run holds the same prompts
    in the same order. The bootstrap resamples the prompts (the same picks for every run: paired)
    and each arm's runs, so the interval holds both the prompt noise and the seed-to-seed noise.
    """
    import numpy as np

    def arrays(arm: Sequence[Sequence[PromptSteps]]) -> tuple[Any, Any]:
        tokens = np.array([[sum(p.emitted) for p in run] for run in arm], dtype=np.float64)
        forwards = np.array([[len(p.emitted) for p in run] for run in arm], dtype=np.float64)
        return tokens, forwards

    (ta, fa), (tb, fb) = arrays(a), arrays(b)
    if ta.shape[1:] != tb.shape[1:] or not ta.size or not tb.size:
        raise ValueError(f"the arms' runs must hold the same prompts: {ta.shape} vs {tb.shape} (runs, prompts)")
    point = float((tb.sum(1) / fb.sum(1)).mean() - (ta.sum(1) / fa.sum(1)).mean())
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, ta.shape[1], size=(samples, ta.shape[1]))

    def means(tokens: Any, forwards: Any) -> Any:
        per_run = tokens[:, picks].sum(-1) / forwards[:, picks].sum(-1)          # [runs, samples]
        runs = rng.integers(0, tokens.shape[0], size=(samples, tokens.shape[0]))
        return np.take_along_axis(per_run.T, runs, axis=1).mean(1)

    diffs = means(tb, fb) - means(ta, fa)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(diffs[np.isfinite(diffs)], [tail, 100 - tail])
    return point, float(lo), float(hi)


def simulated_acceptance_length(step_accuracies: Sequence[float]) -> float:
    """SpecForge's teacher-forced estimate `sum_k prod_{i<=k} acc_i` (no bonus token): a proxy."""
    total, chain = 0.0, 1.0
    for acc in step_accuracies:
        chain *= acc
        total += chain
    return total
