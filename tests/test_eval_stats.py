"""Acceptance figures and the bootstrap interval over prompts (docs/evaluation.md)."""

from __future__ import annotations

import math

import pytest

from draftgate.evaluate.stats import (
    PromptSteps, acceptance_length, accepted_fraction, bootstrap_ci, per_position,
    simulated_acceptance_length, vllm_acceptance_length)

RUNS = [
    PromptSteps(drafted=[4, 4, 4], accepted=[4, 1, 0], emitted=[5, 2, 1]),
    PromptSteps(drafted=[4, 0, 4], accepted=[2, 0, 3], emitted=[3, 1, 4]),
    PromptSteps(drafted=[4, 4], accepted=[0, 0], emitted=[1, 1]),
    PromptSteps(drafted=[4], accepted=[4], emitted=[3]),            # cut at the end token
]


def test_acceptance_length_is_tokens_per_verify_forward_bonus_included():
    assert acceptance_length(RUNS) == (8 + 8 + 2 + 3) / 9


def test_vllm_acceptance_length_skips_steps_that_drafted_nothing():
    assert vllm_acceptance_length(RUNS) == 1 + (4 + 1 + 0 + 2 + 3 + 0 + 0 + 4) / 8


def test_per_position_rates_count_position_i_among_steps_that_drafted_i():
    rates = per_position(RUNS, 4)
    assert rates[0] == 5 / 8            # accepted >= 1 in 5 of the 8 drafting steps
    assert rates[3] == 2 / 8
    assert rates == sorted(rates, reverse=True)
    assert accepted_fraction(RUNS) == 14 / 32


def test_the_bootstrap_interval_is_deterministic_under_a_seed_and_holds_the_estimate():
    many = RUNS * 5
    a = bootstrap_ci(many, samples=500, seed=7)
    assert a == bootstrap_ci(many, samples=500, seed=7)
    assert a != bootstrap_ci(many, samples=500, seed=8)
    assert a[0] <= acceptance_length(many) <= a[1]
    assert a[0] < a[1]


def test_identical_prompts_give_a_zero_width_interval():
    same = [RUNS[0]] * 6
    lo, hi = bootstrap_ci(same, samples=200, seed=0)
    assert math.isclose(lo, acceptance_length(same)) and math.isclose(hi, acceptance_length(same))


def test_specforge_simulated_length_sums_the_products_of_step_accuracies():
    assert simulated_acceptance_length([0.5, 0.5, 1.0]) == 0.5 + 0.25 + 0.25
    assert simulated_acceptance_length([]) == 0.0


def _run(emitted_per_prompt):
    return [PromptSteps([4] * len(e), [x - 1 for x in e], e) for e in emitted_per_prompt]


def test_two_arms_of_the_same_runs_differ_by_nothing_but_seed_noise():
    from draftgate.evaluate.stats import arms_difference

    one = _run([[1, 2, 1], [3, 1], [1, 1, 1, 2]])
    assert arms_difference([one, one], [one, one, one], 500, 0) == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)
    runs = [one, _run([[2, 2, 1], [1, 1], [1, 2, 1, 2]])]
    diff, lo, hi = arms_difference(runs, runs[::-1], 500, 0)
    assert diff == 0.0 and lo < 0 < hi


def test_a_better_arm_is_distinguished_from_prompt_and_seed_noise():
    from draftgate.evaluate.stats import arms_difference

    base = [[1, 2, 1, 1], [2, 1, 1], [1, 1, 3, 1], [1, 2], [2, 2, 1]]
    a = [_run([[x + d for x in p] for p in base]) for d in (0, 0)]
    b = [_run([[x + 1 for x in p] for p in base]) for _ in range(3)]
    diff, lo, hi = arms_difference(a, b, 2000, 0)
    assert diff == pytest.approx(1.0) and lo == pytest.approx(1.0) and hi == pytest.approx(1.0)
    # Seeds that disagree by as much as the arms do: the interval widens to take in zero.
    noisy = [_run([[x + d for x in p] for p in base]) for d in (0, 2)]
    diff, lo, hi = arms_difference(noisy, b, 2000, 0)
    assert diff == pytest.approx(0.0) and lo < 0 < hi


def test_arms_over_other_prompts_are_refused():
    from draftgate.evaluate.stats import arms_difference

    with pytest.raises(ValueError, match="same prompts"):
        arms_difference([_run([[1], [2]])], [_run([[1]])], 10, 0)


def test_rates_over_every_verify_step_compare_proposers_like_with_like():
    from draftgate.evaluate.stats import PromptSteps, acceptance_length, per_position, per_position_all

    # An n-gram proposer drafts on 1 step of 4 and is accepted there; a drafter drafts on all 4
    # and is accepted at position 1 on 2 of them: per_position draws the n-gram higher (1.0 vs
    # 0.5), though the drafter emits more tokens per verify forward.
    ngram = [PromptSteps(drafted=[2, 0, 0, 0], accepted=[1, 0, 0, 0], emitted=[2, 1, 1, 1])]
    eagle = [PromptSteps(drafted=[2, 2, 2, 2], accepted=[1, 1, 0, 0], emitted=[2, 2, 1, 1])]
    assert per_position(ngram, 2)[0] > per_position(eagle, 2)[0]
    assert per_position_all(ngram, 2) == [0.25, 0.0] and per_position_all(eagle, 2) == [0.5, 0.0]
    for run in (ngram, eagle):
        assert 1 + sum(per_position_all(run, 2)) == acceptance_length(run)
