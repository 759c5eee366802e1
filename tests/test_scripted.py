"""The scripted server: a seeded, reproducible fault schedule, per-key scripts, real HTTP."""

from __future__ import annotations

import json

import httpx
import pytest

from draftgate.serve.scripted import RETRYABLE_FAULTS, Script, ScriptedServer, running


def test_the_fault_schedule_is_a_pure_function_of_seed_key_and_attempt():
    a = ScriptedServer(Script(fault_rate=0.3, seed=1))
    b = ScriptedServer(Script(fault_rate=0.3, seed=1))
    c = ScriptedServer(Script(fault_rate=0.3, seed=2))
    plan = [a.plan(f"k{i}", n) for i in range(300) for n in (1, 2)]
    assert plan == [b.plan(f"k{i}", n) for i in range(300) for n in (1, 2)]
    assert plan != [c.plan(f"k{i}", n) for i in range(300) for n in (1, 2)]
    assert 0.2 < sum(x != "ok" for x in plan) / len(plan) < 0.4
    assert set(plan) - {"ok"} <= set(RETRYABLE_FAULTS)


def test_per_key_scripts_play_in_order_then_answer_ok():
    s = ScriptedServer(Script(per_key={"k": ("http_429", "reset")}, fault_rate=1.0))
    assert [s.plan("k", n) for n in (1, 2, 3)] == ["http_429", "reset", "ok"]


def test_it_answers_openai_shaped_completions_and_faults_over_http():
    script = Script(per_key={"b": ("http_429",), "c": ("keepalive_ws",)}, retry_after_s=2)
    with running(script) as server, httpx.Client(base_url=server.base_url) as client:
        def ask(key):
            return client.post("/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": key}]})
        ok = ask("a").json()
        assert ok["choices"][0]["message"]["content"] == "Answer to a." and ok["usage"]["cost"] > 0
        limited = ask("b")
        assert (limited.status_code, limited.headers["retry-after"]) == (429, "2")
        padded = ask("c")
        assert padded.content.startswith(b"\n") and json.loads(padded.content)["model"] == "m"
        with pytest.raises(ValueError, match="unknown scripted action"):
            server._act(None, "nonsense", {}, "x", 0.0)
    assert [a.action for a in server.log] == ["ok", "http_429", "keepalive_ws"]


def test_it_serves_junk_200s_provider_named_429s_and_billed_errors_over_http():
    script = Script(per_key={k: (k,) for k in ("leaked_error_body", "content_parts_json", "content_parts_python",
                                                 "http_429_provider", "error_body_paid", "http_502_paid")},
                    error_metadata={"provider_name": "Fireworks"}, cost_usd=0.003)
    with running(script) as server, httpx.Client(base_url=server.base_url) as client:
        def ask(key):
            return client.post("/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": key}]})

        def content(key):
            return ask(key).json()["choices"][0]["message"]["content"]

        assert json.loads(content("leaked_error_body"))["error"]["code"] == 502
        assert json.loads(content("content_parts_json")) == [{"type": "text", "text": "Answer to content_parts_json."}]
        assert content("content_parts_python") == "[{'type': 'text', 'text': 'Answer to content_parts_python.'}]"
        limited = ask("http_429_provider")
        assert limited.status_code == 429 and "retry-after" in limited.headers
        assert limited.json()["error"]["metadata"]["provider_name"] == "Fireworks"
        for key, status in (("error_body_paid", 200), ("http_502_paid", 502)):
            paid = ask(key)
            assert paid.status_code == status and paid.json()["usage"]["cost"] == 0.003
            assert paid.json()["error"]["metadata"]["provider_name"] == "Fireworks"
