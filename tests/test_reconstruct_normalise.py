"""Provider normalisation: what providers do to the model's output, undone or quarantined."""

from __future__ import annotations

import json

import pytest

from draftgate.reconstruct.normalise import Call, Dialect, normalise
from draftgate.templates import kimi_tool_call_id

QWEN = Dialect(think=("<think>", "</think>"))
KIMI = Dialect(think=("<think>", "</think>"), tool_id=kimi_tool_call_id)
PLAIN = Dialect(think=None)


def row(**kw):
    base = {"status": "ok", "finish_reason": "stop", "reasoning": None, "reasoning_details": None,
            "content": "", "tool_calls": None}
    return {**base, **kw}


def calls(*items):
    return json.dumps([{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                       for i, n, a in items])


def test_plain_reasoning_and_content_pass_through_untouched():
    n = normalise(row(reasoning="  think  ", content="\nanswer "), QWEN)
    assert (n.parts.reasoning, n.parts.content, n.normalisations, n.quarantine) == \
        ("  think  ", "\nanswer ", (), None)


def test_reasoning_comes_from_text_details_when_the_reasoning_field_is_empty():
    details = [{"type": "reasoning.text", "text": "Step 1. "}, {"type": "reasoning.text", "text": "Step 2."}]
    n = normalise(row(reasoning_details=json.dumps(details), content="5"), QWEN)
    assert n.parts.reasoning == "Step 1. Step 2."
    assert n.normalisations == ("reasoning_from_details",)


def test_reasoning_and_details_that_disagree_are_quarantined():
    details = [{"type": "reasoning.text", "text": "Step 1."}]
    n = normalise(row(reasoning="Step 1", reasoning_details=json.dumps(details)), QWEN)
    assert n.quarantine == "reasoning_details_disagree"


@pytest.mark.parametrize("kind, reason", [("reasoning.summary", "reasoning_summary"),
                                          ("reasoning.encrypted", "reasoning_encrypted")])
def test_summary_or_encrypted_details_quarantine_even_when_reasoning_text_is_present(kind, reason):
    details = [{"type": kind, "summary": "s", "data": "x"}]
    n = normalise(row(reasoning="s", reasoning_details=json.dumps(details)), QWEN)
    assert (n.parts, n.quarantine) == (None, reason)


def test_think_block_inside_content_becomes_reasoning():
    n = normalise(row(content="<think>\nadd\n</think>\n\n5"), QWEN)
    assert (n.parts.reasoning, n.parts.content) == ("\nadd\n", "\n\n5")
    assert n.normalisations == ("reasoning_from_content",)


def test_a_prefilled_think_leaves_only_the_closing_marker_in_content():
    n = normalise(row(content="add</think>5"), KIMI)
    assert (n.parts.reasoning, n.parts.content) == ("add", "5")
    assert n.normalisations == ("reasoning_from_content_prefilled",)


def test_an_unclosed_think_block_in_a_truncated_content_is_all_reasoning():
    n = normalise(row(content="<think>\nstill going", finish_reason="length"), QWEN)
    assert (n.parts.reasoning, n.parts.content, n.parts.truncated) == ("\nstill going", "", True)


def test_think_tags_mid_content_stay_text_and_templates_without_think_never_split():
    text = "Use <think> and </think> tags like this."
    assert normalise(row(content=text), QWEN).parts.content == text
    assert normalise(row(content="x</think>y"), PLAIN).parts.content == "x</think>y"


def test_tool_call_arguments_are_the_verbatim_strings_received():
    args = '{"a":1,  "b" : "\\u00e9"}'
    n = normalise(row(tool_calls=calls(("c1", "add", args)), finish_reason="tool_calls"), QWEN)
    assert n.parts.tool_calls == (Call("add", args, "c1"),)


def test_kimi_ids_stripped_of_functions_prefix_are_restored_and_counted():
    n = normalise(row(tool_calls=calls(("add:0", "add", "{}"), ("call_x", "mul", "{}"))), KIMI)
    assert [c.id for c in n.parts.tool_calls] == ["functions.add:0", "functions.mul:1"]
    assert n.normalisations == ("tool_id_restored", "tool_id_restored")


def test_kimi_ids_continue_the_conversations_running_count():
    d = Dialect(think=None, tool_id=kimi_tool_call_id, first_tool_index=3)
    n = normalise(row(tool_calls=calls(("call_x", "mul", "{}"))), d)
    assert n.parts.tool_calls[0].id == "functions.mul:3"


@pytest.mark.parametrize("raw, reason", [
    ("not json", "tool_calls_unparseable"),
    ('{"a": 1}', "tool_calls_unparseable"),
    ('[{"id": "c", "function": {"name": "add", "arguments": {"a": 1}}}]', "tool_arguments_not_string"),
])
def test_tool_calls_that_cannot_be_exact_are_quarantined(raw, reason):
    assert normalise(row(tool_calls=raw), QWEN).quarantine == reason


@pytest.mark.parametrize("kw, reason", [
    ({"status": "failed", "failure_reason": "http_429_exhausted"}, "response_failed:http_429_exhausted"),
    ({"finish_reason": "content_filter"}, "finish_reason_content_filter"),
    ({"finish_reason": None}, "finish_reason_None"),
])
def test_failed_or_unfinished_responses_are_quarantined_with_a_reason(kw, reason):
    assert normalise(row(**kw), QWEN).quarantine == reason
