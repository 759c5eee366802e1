"""The n-gram proposer follows vLLM's prompt-lookup rule (docs/evaluation.md)."""

from __future__ import annotations

import pytest

from draftgate.evaluate.ngram import propose


def test_the_longest_recurring_suffix_wins_over_a_shorter_one():
    # suffix [7, 8, 9]: the 3-gram recurs at 4..6 (-> 50), the 1-gram [9] recurs earlier at 0 (-> 40)
    seq = [9, 40, 1, 2, 7, 8, 9, 50, 51, 7, 8, 9]
    assert propose(seq, k=2, n_min=1, n_max=3) == [50, 51]


def test_of_several_matches_of_that_length_the_earliest_is_taken():
    seq = [5, 6, 10, 11, 5, 6, 20, 21, 5, 6]
    assert propose(seq, k=2, n_min=2, n_max=2) == [10, 11]


def test_no_n_gram_below_n_min_is_used():
    seq = [1, 2, 3, 4, 9, 5, 6, 7, 8, 9]       # only the 1-gram [9] recurs
    assert propose(seq, k=3, n_min=2, n_max=4) == []
    assert propose(seq, k=3, n_min=1, n_max=4) == [5, 6, 7]


def test_no_n_gram_above_n_max_is_used():
    # the 4-gram [1, 2, 3, 4] recurs (-> 60) but n_max = 2: its 2-gram [3, 4] recurs first at 2 (-> 70)
    seq = [0, 0, 3, 4, 70, 1, 2, 3, 4, 60, 1, 2, 3, 4]
    assert propose(seq, k=1, n_min=1, n_max=2) == [70]
    assert propose(seq, k=1, n_min=1, n_max=4) == [60]


def test_proposals_stop_at_k_and_at_the_end_of_the_sequence():
    seq = [1, 2, 3, 4, 5, 1, 2]
    assert propose(seq, k=2, n_min=2, n_max=2) == [3, 4]
    assert propose(seq, k=10, n_min=2, n_max=2) == [3, 4, 5, 1, 2]


def test_the_suffix_itself_is_not_a_match():
    assert propose([1, 2, 3], k=3, n_min=1, n_max=3) == []
    # an overlapping earlier occurrence counts: [7, 7] at 0 is followed by 7
    assert propose([7, 7, 7], k=3, n_min=2, n_max=2) == [7]


def test_vllm_default_5_5_needs_a_five_token_repeat():
    text = [10, 11, 12, 13, 14, 15, 99, 10, 11, 12, 13, 14]
    assert propose(text, k=4, n_min=5, n_max=5) == [15, 99, 10, 11]
    assert propose(text[:-1], k=4, n_min=5, n_max=5) == []


@pytest.mark.parametrize("k,lo,hi", [(0, 1, 2), (2, 0, 2), (2, 3, 2)])
def test_bad_bounds_are_refused(k, lo, hi):
    with pytest.raises(ValueError):
        propose([1, 2, 1, 2], k=k, n_min=lo, n_max=hi)


def test_replay_counts_the_steps_the_rule_would_take_over_known_ids():
    from draftgate.evaluate.ngram import replay

    prompt = [1, 2, 3, 4, 5, 6]
    output = [1, 2, 3, 4, 9, 9]      # prefill gave 1; [1] recurs -> drafts 2, 3, 4 (accepted), 5 (rejected)
    drafted, accepted, emitted = replay(prompt, output, k=4, n_min=1, n_max=1)
    assert drafted[0] == 4 and accepted[0] == 3 and emitted[0] == 4
    assert 1 + sum(emitted) == len(output)
