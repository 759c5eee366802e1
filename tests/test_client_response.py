"""Parsing completions: model-produced JSON stays byte-exact; retryable and junk 200s are recognised."""

from __future__ import annotations

import json

import pytest

from draftgate.client.response import BadBody, ErrorInfo, error_info, junk_reason, parse_completion, raw_span

# Arguments with odd spacing, a unicode escape and keys out of order: a re-serialiser would change all three.
ODD_CALLS = ('[ {"id" : "add:0","type":"function", "function":{"name":"add",'
             '"arguments":"{ \\"b\\":2 ,\\"a\\" :  1, \\"s\\": \\"\\\\u00e9\\"}"}} ]')


def body(message: str, extra: str = "") -> bytes:
    return ('{"id":"gen-1","provider":"P","model":"m","choices":[{"index":0,"finish_reason":"tool_calls",'
            f'"native_finish_reason":"tool_calls","message":{message}}}],'
            '"usage":{"prompt_tokens":5,"completion_tokens":7}' + extra + '}').encode()


def test_tool_calls_are_the_exact_source_text_of_the_array():
    c = parse_completion(body('{"role":"assistant","content":null,"tool_calls":' + ODD_CALLS + '}'))
    assert c.tool_calls == ODD_CALLS
    args = json.loads(c.tool_calls)[0]["function"]["arguments"]
    assert args == '{ "b":2 ,"a" :  1, "s": "\\u00e9"}'


def test_leading_keepalive_whitespace_is_skipped():
    c = parse_completion(b"\n\n   \n" + body('{"role":"assistant","content":"hi"}'))
    assert (c.content, c.generation_id, c.provider, c.usage["completion_tokens"]) == ("hi", "gen-1", "P", 7)


def test_reasoning_details_and_logprobs_are_kept_as_received():
    details = '[{"type":"reasoning.text","text":"think  ","format":null}]'
    raw = ('{"choices":[{"finish_reason":"stop","logprobs":{"content":[{"token":"a","logprob":-0.10000000000000001}]},'
           '"message":{"content":"a","reasoning":"think  ","reasoning_details":' + details + '}}]}').encode()
    c = parse_completion(raw)
    assert c.reasoning_details == details
    assert c.logprobs == '{"content":[{"token":"a","logprob":-0.10000000000000001}]}'


def test_raw_span_takes_the_last_duplicate_key_like_json_loads():
    text = '{"a": [1, 2], "a" : {"x": "y"} }'
    assert raw_span(text, ("a",)) == '{"x": "y"}'
    assert raw_span(text, ("a", "x")) == '"y"'
    assert raw_span(text, ("b",)) is None
    assert raw_span('{"l": [ 0 , [1,2] ]}', ("l", 1)) == "[1,2]"


@pytest.mark.parametrize("raw, cause", [
    (b'{"error":{"code":502,"message":"upstream"}}', "error_body"),
    (body('{"role":"assistant","content":"","reasoning":null}'), "empty_output"),
    (body('{"role":"assistant","content":"x"}').replace(b'"tool_calls"', b'"error"', 1), "finish_error"),
    (body('{"role":"assistant","content":"x"}')[:40], "malformed_json"),
    (b'{"choices":[]}', "no_choices"),
    (b"\xff\xfe", "malformed_json"),
])
def test_unusable_200s_raise_the_retry_cause(raw, cause):
    with pytest.raises(BadBody) as e:
        parse_completion(raw)
    assert e.value.cause == cause


def test_a_billed_empty_answer_carries_its_usage():
    with pytest.raises(BadBody) as e:
        parse_completion(body('{"role":"assistant","content":""}'))
    assert e.value.usage == {"prompt_tokens": 5, "completion_tokens": 7}


def test_local_backend_token_ids_are_read():
    raw = ('{"prompt_token_ids":[1,2],"choices":[{"finish_reason":"stop","token_ids":[5,6,2],'
           '"message":{"content":"hi"}}]}').encode()
    c = parse_completion(raw)
    assert (c.token_ids, c.prompt_token_ids) == ([5, 6, 2], [1, 2])


LEAK = '{"error": {"message": "Upstream error from Fireworks", "code": 502}}'
PARTS_JSON = '[{"type": "text", "text": "The answer is 4."}]'
PARTS_PY = "[{'type': 'text', 'text': 'The answer is 4.'}]"


@pytest.mark.parametrize("content, cause", [
    (LEAK, "leaked_error_body"),
    ('\n  {"object": "error", "message": "model overloaded", "code": 503}', "leaked_error_body"),
    (PARTS_JSON, "content_parts_repr"),
    (PARTS_PY, "content_parts_repr"),
    ("[{'text': 'multi\\nline', 'type': 'output_text'}]\n", "content_parts_repr"),
])
def test_a_200_whose_content_is_junk_raises_its_reason_with_the_completion_as_received(content, cause):
    with pytest.raises(BadBody) as e:
        parse_completion(body(json.dumps({"role": "assistant", "content": content})))
    assert e.value.cause == cause
    assert e.value.completion.content == content and e.value.completion.provider == "P"
    assert e.value.usage == {"prompt_tokens": 5, "completion_tokens": 7}   # paid for: wasted spend


@pytest.mark.parametrize("content", [
    "The error was a typo.", '{"error": null, "result": 4}', '{"result": 4}', '[{"type": "fruit", "name": "fig"}]',
    "[1, 2]", "[]", "see [{'type': 'text', 'text': 'x'}]", '[{"type": "text", "text": "a"}, "b"]',
])
def test_answers_that_merely_look_like_json_are_kept(content):
    assert junk_reason(content) is None
    assert parse_completion(body(json.dumps({"role": "assistant", "content": content}))).content == content


def test_an_error_body_keeps_its_usage_and_names_the_provider_from_its_metadata():
    raw = (b'{"error":{"code":502,"message":"Provider returned error","metadata":{"provider_name":"Fireworks",'
           b'"raw":"upstream 500"}},"usage":{"prompt_tokens":9,"completion_tokens":5,"cost":0.002}}')
    with pytest.raises(BadBody) as e:
        parse_completion(raw)
    assert (e.value.cause, e.value.usage["cost"]) == ("error_body", 0.002)
    assert (e.value.error.provider, e.value.error.metadata["raw"]) == ("Fireworks", "upstream 500")
    assert error_info(raw) == e.value.error


def test_error_info_tolerates_bodies_that_are_not_error_objects():
    assert error_info(b"<html>502 Bad Gateway</html>").message == "<html>502 Bad Gateway</html>"
    assert error_info(b'["x"]') == ErrorInfo("['x']", {}, None, None)
    assert error_info(b'{"error":"plain text"}').message == "plain text"
