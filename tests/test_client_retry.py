"""Retry classification per docs/openrouter.md, backoff with jitter, Retry-After, and the 429 pause."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from draftgate.client.retry import PauseGate, Policy, classify_exception, classify_status, retry_after_s


def err(code: int, **metadata) -> bytes:
    e = {"code": code, "message": "m"}
    if metadata:
        e["metadata"] = metadata
    return json.dumps({"error": e}).encode()


@pytest.mark.parametrize("status, meta, kind, cause", [
    (400, {}, "final", "http_400"),
    (403, {}, "final", "http_403"),
    (401, {}, "stop", "auth_401"),
    (402, {"limit_source": "openrouter_credits"}, "stop", "credits_402"),
    (402, {}, "stop", "credits_402"),
    (402, {"limit_source": "openrouter_in_flight_budget"}, "retry", "http_402_inflight"),
    (403, {"limit_source": "openrouter_key_limit"}, "stop", "limit_403"),
    (408, {}, "retry", "http_408"),
    (429, {}, "retry", "http_429"),
    (500, {}, "retry", "http_500"),
    (502, {}, "retry", "http_502"),
    (503, {}, "retry", "http_503"),
    (524, {}, "retry", "http_524"),
])
def test_status_codes_are_classified_as_facts_md_says(status, meta, kind, cause):
    v = classify_status(status, httpx.Headers({}), err(status, **meta))
    assert (v.kind, v.cause) == (kind, cause)


def test_a_2xx_is_left_to_the_body_parser():
    assert classify_status(200, httpx.Headers({}), b"{}") is None


def test_x_should_retry_overrides_retry_and_final_but_never_a_stop():
    assert classify_status(400, httpx.Headers({"x-should-retry": "true"}), err(400)).kind == "retry"
    assert classify_status(503, httpx.Headers({"x-should-retry": "false"}), err(503)).kind == "final"
    assert classify_status(401, httpx.Headers({"x-should-retry": "true"}), err(401)).kind == "stop"


def test_in_flight_402_carries_its_retry_after():
    v = classify_status(402, httpx.Headers({"Retry-After": "3"}),
                        err(402, limit_source="openrouter_in_flight_budget"))
    assert v.wait_s == 3.0


def test_retry_after_ms_wins_over_seconds_and_http_dates_are_read():
    assert retry_after_s(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    assert retry_after_s(httpx.Headers({"retry-after": "2"})) == 2.0
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 < retry_after_s(httpx.Headers({"retry-after": date})) <= 30
    assert retry_after_s(httpx.Headers({"retry-after": "soon"})) is None


def test_backoff_doubles_from_half_a_second_to_eight_with_jitter():
    p, rng = Policy(), random.Random(0)
    waits = [p.backoff_s(a, rng) for a in range(1, 8)]
    for a, w in enumerate(waits, start=1):
        full = min(0.5 * 2 ** (a - 1), 8.0)
        assert 0.75 * full <= w <= full
    assert len({round(w, 6) for w in waits[-3:]}) == 3   # jittered, not a constant cap


def test_a_server_hint_is_honoured_up_to_the_cap():
    p = Policy(retry_after_cap_s=5)
    assert p.backoff_s(1, random.Random(0), hint=2.0) == 2.0
    assert p.backoff_s(1, random.Random(0), hint=120.0) == 5.0


def test_transport_errors_and_timeouts_are_retryable_but_bugs_are_not_swallowed():
    assert classify_exception(TimeoutError()).cause == "timeout"
    assert classify_exception(httpx.ConnectError("refused")).cause == "connect"
    assert classify_exception(httpx.RemoteProtocolError("reset")).cause == "connection"
    with pytest.raises(KeyError):
        classify_exception(KeyError("bug"))


def test_a_burst_of_429s_pauses_every_sender_for_the_retry_after():
    gate = PauseGate(Policy(burst_429=3, burst_window_s=2.0))
    rng = random.Random(0)
    gate.note_429(0.3, 1, rng)
    gate.note_429(0.3, 1, rng)
    assert gate.until == 0.0          # two are not a burst
    gate.note_429(0.3, 1, rng)
    t0 = time.monotonic()
    asyncio.run(gate.wait())
    assert 0.25 <= time.monotonic() - t0 < 0.6
    assert gate.pauses == 1
