"""Logprob token bytes -> ids through an exact bytes map of the real Qwen3 vocabulary."""

from __future__ import annotations

import json

import pytest

from draftgate.reconstruct.logprobs import BytesIndex


@pytest.fixture(scope="module")
def index(qwen3_tok):
    return BytesIndex(qwen3_tok.token_bytes, qwen3_tok.vocab_size)


def entries(*items):
    return json.dumps({"content": [dict(logprob=-0.5, top_logprobs=[], **i) for i in items]})


def test_the_qwen3_vocabulary_maps_bytes_to_ids_without_ambiguity(index, qwen3_tok):
    assert index.ambiguous == frozenset()
    assert len(index.index) == qwen3_tok.vocab_size


def test_bytes_win_over_the_token_string_and_a_split_character_maps_per_token(index, qwen3_tok):
    a, b = qwen3_tok.token_id("Ã"), qwen3_tok.token_id("©")        # "é" over two tokens
    look = index.lookup(entries({"token": "\ufffd", "bytes": [0xC3]}, {"token": "\ufffd", "bytes": [0xA9]}))
    assert look.ids == (a, b)


def test_a_vllm_bytes_token_without_a_bytes_field_is_parsed(index, qwen3_tok):
    look = index.lookup(entries({"token": "bytes:\\xc3", "bytes": None}, {"token": " Pant", "bytes": None}))
    assert look.ids == (qwen3_tok.token_id("Ã"), 53122)


def test_special_tokens_map_to_their_added_ids(index, qwen3_tok):
    look = index.lookup(entries({"token": "<|im_end|>", "bytes": list(b"<|im_end|>")}))
    assert look.ids == (qwen3_tok.token_id("<|im_end|>"),)


@pytest.mark.parametrize("raw, reason", [
    (None, "logprobs_absent"),
    ("{}", "logprobs_unparseable"),
    (entries({"token": "\ufffd", "bytes": None}), "logprobs_no_bytes"),
    (entries({"token": "two words here", "bytes": None}), "logprobs_unmapped"),
])
def test_what_cannot_be_mapped_exactly_gives_a_reason_not_ids(index, raw, reason):
    assert index.lookup(raw).reason == reason


def test_a_byte_string_two_ids_share_is_ambiguous_and_refused():
    table = {0: b"a", 1: b"b", 2: b"a"}
    idx = BytesIndex(table.__getitem__, 3)
    assert idx.lookup(entries({"token": "a"})).reason == "logprobs_ambiguous"
    assert idx.lookup(entries({"token": "b"})).ids == (1,)
