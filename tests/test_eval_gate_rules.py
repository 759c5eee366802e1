"""The eval gate's rules on one output, without the target: the stop rule and the step counts."""

from __future__ import annotations

from draftgate.checks.eval import steps_ok, stop_ok

END = frozenset([7])


def test_an_output_stops_after_its_end_token_or_at_max_new_tokens():
    assert stop_ok([1, 2, 7], 10, END)
    assert stop_ok([1, 2, 3], 3, END)
    assert not stop_ok([1, 2, 3], 10, END)            # neither an end token nor the limit
    assert not stop_ok([1, 7, 3], 3, END)             # went on past the end token
    assert not stop_ok([1, 2, 3, 4], 3, END)          # past the limit
    assert not stop_ok([], 3, END)


def test_step_counts_must_be_possible_and_account_for_every_token():
    out = [5] * 8                                      # 1 from the prefill + 4 + 2 + 1
    assert steps_ok(out, drafted=[4, 4, 2], accepted=[3, 1, 0], emitted=[4, 2, 1], k=4)
    assert not steps_ok(out, drafted=[4, 4, 2], accepted=[3, 1, 0], emitted=[4, 2, 2], k=4)   # 9 tokens
    assert not steps_ok(out, drafted=[4, 4, 2], accepted=[3, 1, 3], emitted=[4, 2, 1], k=4)   # accepted > drafted
    assert not steps_ok(out, drafted=[5, 4, 2], accepted=[3, 1, 0], emitted=[4, 2, 1], k=4)   # drafted > k
    assert not steps_ok(out, drafted=[4, 4, 2], accepted=[3, 2, 0], emitted=[4, 2, 1], k=4)   # cut before the last step
    assert steps_ok([5, 5, 5], drafted=[4], accepted=[4], emitted=[2], k=4)                   # the last step cut by the stop
