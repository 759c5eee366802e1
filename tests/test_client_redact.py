"""What the journal keeps of error bodies: everything as sent except secrets."""

from __future__ import annotations

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
