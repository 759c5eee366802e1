"""Special-token structure flags on ids (pure: small integer ids stand for the markers)."""

from __future__ import annotations

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from draftgate.reconstruct.flags import Markers, balanced, flags, prompt_think_open

END, THINK, END_THINK, CALL, END_CALL, SECTION = 900, 901, 902, 903, 904, 905
M = Markers(end=END, think=(THINK, END_THINK), tool_pairs=((CALL, END_CALL),))


@pytest.mark.parametrize("ids, ok", [
    ([THINK, 1, END_THINK, 2, CALL, 3, END_CALL, END], True),
    ([THINK, 1, 2, END], False),                 # never closed
    ([END_THINK, 1, END], False),                # closed before opened
    ([THINK, THINK, END_THINK, END], False),     # nested
])
def test_think_markers_must_alternate_and_end_closed(ids, ok):
    assert flags(ids, [], False, M).think_balanced is ok


def test_a_prefilled_think_in_the_prompt_opens_the_block_for_the_completion():
    assert flags([1, END_THINK, 2, END], [7, THINK], False, M).think_balanced is True
    assert flags([1, END_THINK, 2, END], [7, THINK, END_THINK], False, M).think_balanced is False


def test_a_truncated_completion_may_stop_inside_a_block_but_not_end_with_eos():
    f = flags([THINK, 1, 2], [], True, M)
    assert (f.think_balanced, f.ends_with_eos) == (True, False)
    assert flags([CALL, 1], [], True, M).tool_markers_balanced is True
    assert flags([CALL, 1, END], [], False, M).tool_markers_balanced is False


def test_kimis_tool_section_may_close_the_think_block_implicitly():
    kimi = Markers(end=END, think=(THINK, END_THINK), tool_pairs=((SECTION, 906),),
                   think_implicit_close=frozenset({SECTION}))
    assert flags([1, SECTION, 2, 906, END], [THINK], False, kimi).think_balanced is True
    assert flags([1, SECTION, 2, 906, END], [THINK], False, M).think_balanced is False


def test_balanced_without_markers_is_trivially_true():
    assert balanced([1, 2, 3], THINK, END_THINK)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([1, 2, THINK, END_THINK, END]), max_size=12))
def test_the_prompts_think_state_is_set_by_its_last_think_marker(prompt):
    last = next((i for i in reversed(prompt) if i in (THINK, END_THINK)), None)
    assert prompt_think_open(prompt, M) is (last == THINK)
    # Handing flags the state it would compute changes nothing.
    completion = [1, END_THINK, 2, END]
    assert flags(completion, prompt, False, M, think_open=prompt_think_open(prompt, M)) == \
        flags(completion, prompt, False, M)
