"""Request bodies per backend, and a request hash that moves with output-shaping params only."""

from __future__ import annotations

import json

import pytest

from draftgate.client.request import Prompt, build_body, prompt_from_row, request_hash
from draftgate.config import parse_params

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
PROMPT = Prompt("id", "d", [{"role": "user", "content": "hi"}], TOOLS, 10)


def gen(**kw):
    return parse_params({"generate": kw}).generate


def h(**kw) -> str:
    p = gen(**kw)
    return request_hash(build_body(PROMPT, p), p.backend)


def test_openrouter_bodies_carry_routing_reasoning_usage_and_the_prompts_tools():
    p = gen(backend="openrouter", model="moonshotai/kimi-k2.5", provider={"ignore": ["Fireworks"]},
            reasoning={"effort": "high"}, logprobs=True, top_logprobs=3, extra_body={"tool_choice": "auto"})
    body = build_body(PROMPT, p)
    assert body["provider"] == {"ignore": ["Fireworks"]} and body["reasoning"] == {"effort": "high"}
    assert body["usage"] == {"include": True} and body["tools"] == TOOLS
    assert (body["logprobs"], body["top_logprobs"], body["tool_choice"]) == (True, 3, "auto")
    assert "return_token_ids" not in body


def test_local_bodies_ask_for_token_ids_and_drop_openrouter_extras():
    body = build_body(PROMPT, gen(backend="local", provider={"only": ["x"]}))
    assert body["return_token_ids"] is True
    assert "provider" not in body and "usage" not in body and "logprobs" not in body


@pytest.mark.parametrize("change", [
    {"temperature": 0.1}, {"top_p": 0.5}, {"max_tokens": 7}, {"seed": 1}, {"model": "other"},
    {"logprobs": True}, {"backend": "local"}, {"extra_body": {"stop": ["x"]}},
])
def test_the_hash_moves_with_every_output_shaping_param(change):
    assert h(**{"backend": "openrouter", **change}) != h(backend="openrouter")


def test_the_hash_moves_with_provider_routing_and_reasoning_on_openrouter():
    assert h(backend="openrouter", provider={"only": ["a"]}) != h(backend="openrouter")
    assert h(backend="openrouter", reasoning={"effort": "low"}) != h(backend="openrouter")


@pytest.mark.parametrize("change", [
    {"concurrency": 999}, {"api_key_env": "OTHER"}, {"base_url": "http://elsewhere/v1"}, {"max_attempts": 2},
    {"timeout_s": 1.0}, {"budget_usd": 5.0}, {"limit": 3}, {"retry_base_s": 0.1}, {"app_title": "x"},
])
def test_the_hash_ignores_what_does_not_shape_the_output(change):
    assert h(**{"backend": "openrouter", **change}) == h(backend="openrouter")


def test_the_hash_is_independent_of_key_order_in_messages():
    a = Prompt("id", "d", [{"role": "user", "content": "hi"}], None, 10)
    b = Prompt("id", "d", [{"content": "hi", "role": "user"}], None, 10)
    p = gen()
    assert request_hash(build_body(a, p), "local") == request_hash(build_body(b, p), "local")


def test_a_prompt_row_with_broken_messages_names_the_row_and_the_fix():
    with pytest.raises(ValueError, match=r"prompts.parquet:row 4: prompt 'x'.*re-run the prompts stage"):
        prompt_from_row({"prompt_id": "x", "messages": "[{", "tools": None}, "prompts.parquet:row 4")
    p = prompt_from_row({"prompt_id": "x", "dataset": "d", "messages": json.dumps([{"role": "user", "content": "a"}]),
                         "tools": json.dumps(TOOLS)}, "w")
    assert p.tools == TOOLS and p.chars > 0


IDENTITY = {"weights": "a" * 64, "tokenizer": "b" * 64, "chat_template": "c" * 64, "device": "cpu"}


@pytest.mark.parametrize("part", ["weights", "tokenizer", "chat_template", "device"])
def test_the_hash_moves_with_the_served_models_fingerprints(part):
    body = build_body(PROMPT, gen(backend="local"))
    assert request_hash(body, "local", IDENTITY) != request_hash(body, "local", {**IDENTITY, part: "x"})
    assert request_hash(body, "local", IDENTITY) != request_hash(body, "local")


def test_without_an_identity_the_hash_is_the_one_existing_journals_hold():
    # Remote journals written before identities were hashed must still resume (paid answers).
    import hashlib

    body = build_body(PROMPT, gen(backend="openrouter"))
    shaping = {k: v for k, v in body.items() if k not in ("stream", "usage", "return_token_ids")}
    before = hashlib.sha256(json.dumps({**shaping, "backend": "openrouter"}, sort_keys=True, separators=(",", ":"),
                                       ensure_ascii=False).encode()).hexdigest()
    assert request_hash(body, "openrouter") == request_hash(body, "openrouter", {}) == before
