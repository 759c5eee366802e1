"""exact / bpe_only / semantic / unknown, judged on bytes, with the first difference kept."""

from __future__ import annotations

import json

from draftgate.reconstruct.classify import compare, first_difference


def test_foo_bar_split_apart_is_bpe_only_against_the_merged_id(qwen3_tok):
    merged = qwen3_tok.encode_ordinary("foobar")
    assert merged == [50267]
    c = compare(merged, [7975, 2257], qwen3_tok.token_bytes)
    assert (c.match, c.first_diff) == ("bpe_only", 0)
    assert json.loads(c.context)["truth"]["pieces"] == ["foo", "bar"]


def test_two_splits_of_one_character_that_both_decode_to_replacement_chars_are_compared_as_bytes(qwen3_tok):
    # "é" = C3 A9 and "ê" = C3 AA: split per byte, each side decodes to two U+FFFD characters.
    a = [qwen3_tok.token_id("Ã"), qwen3_tok.token_id("©")]
    b = [qwen3_tok.token_id("Ã"), qwen3_tok.token_id("ª")]
    assert qwen3_tok.decode(a[1:]) == qwen3_tok.decode(b[1:]) == "\ufffd"
    assert compare(a, b, qwen3_tok.token_bytes).match == "semantic"


def test_exact_and_unknown_carry_no_position():
    tb = {1: b"x", 2: b"y"}.__getitem__
    assert compare([1, 2], [1, 2], tb).first_diff is None
    assert compare([1, 2], None, tb).match == "unknown"


def test_a_prefix_differs_at_the_shorter_length():
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_the_differing_span_excludes_the_common_prefix_and_suffix():
    def tb(i):
        return b"x"

    c = compare([1, 2, 3, 4, 9], [1, 2, 5, 4, 9], tb)
    assert (c.first_diff, c.span) == (2, (1, 1))
    # One token split in two: the span counts one against two, not the shifted tail.
    assert compare([7, 8, 8, 6, 6], [7, 8, 6, 6], tb).span == (1, 0)
    assert compare([7, 3, 4, 6, 6], [7, 5, 6, 6], tb).span == (2, 1)
    assert compare([1, 2], [1, 2, 3], tb).span == (0, 1)
