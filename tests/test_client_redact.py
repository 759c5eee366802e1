"""What the client keeps of answers and error bodies: everything as received except the secrets."""

from __future__ import annotations

import json

from draftgate.client.redact import REDACTED, redact

KEY = "sk-or-v1-" + "ab12" * 12


def test_the_runs_own_key_is_removed_wherever_it_appears():
    assert redact({"raw": f"bad key {KEY}!", "list": [KEY]}, (KEY,)) == {"raw": f"bad key {REDACTED}!",
                                                                        "list": [REDACTED]}


def test_members_named_like_credentials_are_replaced_whole_and_others_kept():
    meta = {"provider_name": "Fireworks", "Authorization": "Bearer x", "x-api-key": "k", "api_key": None,
            "limit_source": "openrouter_credits", "headers": {"Cookie": "s=1"}, "retry_after": 3}
    assert redact(meta) == {"provider_name": "Fireworks", "Authorization": REDACTED, "x-api-key": REDACTED,
                            "api_key": None, "limit_source": "openrouter_credits",
                            "headers": {"Cookie": REDACTED}, "retry_after": 3}


def test_bearer_tokens_and_key_shaped_strings_are_replaced_in_any_text():
    text = "upstream said: Authorization: Bearer abcdefgh12345678 with sk-proj-AAAAAAAAAAAAAAAAAAAA"
    assert redact(text) == f"upstream said: Authorization: {REDACTED} with {REDACTED}"
    assert redact("the error was a bearer of bad news") == "the error was a bearer of bad news"


def test_model_output_loses_only_the_runs_own_key():
    code = "headers = {'Authorization': 'Bearer abcdefgh12345678'}"
    assert redact({"content": code}, (KEY,), patterns=False) == {"content": code}
    assert redact({"content": f"echo {KEY}"}, (KEY,), patterns=False) == {"content": f"echo {REDACTED}"}


def body(content: str, calls: str = "null", provider: str = "P", logprobs: str = "null") -> bytes:
    return ('{"id":"gen-1","provider":"' + provider + '","model":"m","choices":[{"index":0,"finish_reason":"stop",'
            '"logprobs":' + logprobs + ',"token_ids":[1,2,3],"message":{"role":"assistant","content":"' + content +
            '","tool_calls":' + calls + '}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}').encode()


def test_an_answer_with_the_key_keeps_everything_else_byte_exact_and_names_the_fields_it_was_cut_from():
    from draftgate.client.response import parse_completion

    calls = '[ {"id":"c:0","function":{"name":"f","arguments":"{ \\"k\\" : \\"' + KEY + '\\" }"}} ]'
    logprobs = '{"content":[{"token":"x","logprob":-1.0}]}'
    comp = parse_completion(body(f"use {KEY} here", calls, f"Echo {KEY}", logprobs), (KEY,))
    assert comp.content == f"use {REDACTED} here" and comp.provider == f"Echo {REDACTED}"
    assert comp.tool_calls == calls.replace(KEY, REDACTED)            # the raw text, odd spacing and all
    # Ids and logprobs spell the text token by token, so the key would survive in them in pieces.
    assert comp.logprobs is None and comp.token_ids is None
    assert comp.redacted == ("content", "logprobs", "provider", "token_ids", "tool_calls")
    clean = parse_completion(body("no secret here", calls.replace(KEY, "v"), logprobs=logprobs), (KEY,))
    assert clean.redacted == () and clean.token_ids == [1, 2, 3] and clean.logprobs == logprobs


def test_a_key_hidden_behind_json_escapes_is_found_in_the_decoded_text():
    from draftgate.client.response import parse_completion

    escaped = "".join(f"\\u{ord(c):04x}" for c in KEY)       # each character as the body's JSON escape
    calls = '[{"id":"c:0","function":{"name":"f","arguments":"{\\"k\\": \\"' + escaped + '\\"}"}}]'
    comp = parse_completion(body(escaped, calls), (KEY,))
    assert comp.content == REDACTED and "tool_calls" in comp.redacted
    assert KEY not in comp.tool_calls and json.loads(json.loads(comp.tool_calls)[0]["function"]["arguments"]) == {
        "k": REDACTED}


def test_an_error_body_and_a_malformed_answer_lose_the_key_before_they_are_quoted():
    from draftgate.client.response import BadBody, parse_completion
    from draftgate.client.retry import classify_status

    v = classify_status(429, {}, ('{"error":{"code":429,"message":"key ' + KEY + ' is limited"}}').encode(), (KEY,))
    assert KEY not in v.detail and REDACTED in v.detail
    raw = ('{"id":"' + KEY + '", "choices": [').encode()          # cut: the detail quotes the first bytes
    try:
        parse_completion(raw, (KEY,))
    except BadBody as b:
        assert b.cause == "malformed_json" and KEY[:20] not in b.detail
