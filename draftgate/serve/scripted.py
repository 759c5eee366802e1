"""Scripted OpenAI-compatible server on loopback: replays canned completions, injects faults.

Tests and the client benchmark talk to it over real HTTP. It is a bare asyncio protocol (no web
framework) so that thousands of concurrent keep-alive connections cost little CPU and every fault
is under exact control: status codes with Retry-After, resets, hangs past the client timeout,
200s with an error body, empty output, `finish_reason: error`, malformed JSON, whitespace
keep-alive bytes before the body (chunked), slow answers, and provider quirks seen on OpenRouter:
junk 200s (a provider error leaked into `content`, content parts serialised as JSON or as a Python
repr), a provider's 429 naming it in `error.metadata`, and error bodies that carry billed `usage`.
`echo_key` answers ok with the request's own Bearer key echoed into the content, the reasoning, a
tool call's arguments, the generation id and the `provider` field (`echo_key_escaped`: the same,
every character of the key written as a JSON \\u escape), as a careless or hostile provider could.

What a request gets is decided by its key (the text of the last message) and how many times that
key was seen: `Script.per_key[key]` lists actions for attempts 1, 2, ... (then "ok"); otherwise a
seeded draw with probability `fault_rate` picks one of `faults`. Same seed, same schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

# Faults a correct client retries; `timeout` needs a client timeout below Script.hang_s.
RETRYABLE_FAULTS = (
    "http_408", "http_429", "http_500", "http_502", "http_503", "http_402_inflight",
    "reset", "timeout", "error_body", "empty_output", "finish_error", "malformed_json",
    # Seen in real OpenRouter traffic (docs/openrouter.md): junk in a billed 200, provider-named 429s, paid errors.
    "leaked_error_body", "content_parts_json", "content_parts_python", "http_429_provider",
    "error_body_paid", "http_502_paid",
)
# Faults that end a prompt (400, 403) or the whole run (401, credits 402).
FINAL_FAULTS = ("http_400", "http_401", "http_402_credits", "http_403", "http_403_key_limit")
# Successful answers with a twist the client must tolerate.
BENIGN = ("ok", "keepalive_ws", "slow")
# Ok answers that carry the request's key back (client/redact.py must keep it out of every file).
ECHOES = ("echo_key", "echo_key_escaped")
QUIRKS = ("think_in_content", "bare_tool_ids", "trim_reasoning", "logprobs_null", "model_slug")

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 402: "Payment Required",
            403: "Forbidden", 404: "Not Found", 408: "Request Timeout", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


@dataclass(frozen=True)
class Script:
    fault_rate: float = 0.0
    faults: tuple[str, ...] = RETRYABLE_FAULTS
    seed: int = 0
    per_key: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # key -> the message object to answer with (dict), or a complete raw JSON body (str) sent as is.
    replies: dict[str, Any] = field(default_factory=dict)
    quirks: tuple[str, ...] = ()
    delay_s: tuple[float, float] = (0.0, 0.0)   # uniform answer delay for every request
    slow_s: float = 0.5                          # the "slow" action
    hang_s: float = 30.0                         # the "timeout" action: silence this long
    retry_after_s: float = 0.05                  # sent with 429 / in-flight 402 / 503
    cost_usd: float = 0.0001                     # usage.cost of each completion
    api_key: str | None = None                   # when set, any other Bearer gets a 401
    provider: str = "Scripted"
    # Merged into error.metadata of the provider-attributed faults (http_429_provider, *_paid):
    # e.g. {"provider_name": "Fireworks"} for a 429 from another provider than the one answering.
    error_metadata: dict[str, Any] = field(default_factory=dict)
    # Bench mode: answer every request with one prebuilt body, no parsing, no log.
    canned: bool = False


@dataclass
class Arrival:
    t: float
    key: str
    attempt: int
    action: str


class ScriptedServer:
    def __init__(self, script: Script | None = None):
        self.script = script or Script()
        self.log: list[Arrival] = []
        self.requests = 0
        self.connections = 0
        self._seen: Counter = Counter()
        self._rng = random.Random(self.script.seed)
        self._canned = _http(200, _body_bytes(_completion(
            {"model": "canned", "messages": [{"role": "user", "content": "canned"}]},
            "canned", self.script)))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Transport] = set()
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # ------------------------------------------------------------ lifecycle

    async def start_async(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: _Conn(self), host, port, backlog=4096, reuse_address=True)
        port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"http://{host}:{port}/v1"
        return self.base_url

    async def stop_async(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.abort()
            await self._server.wait_closed()

    def start(self) -> str:
        """Serve from a background thread with its own loop; returns the base URL."""
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            loop.run_until_complete(self.start_async())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop_async())
            loop.close()

        self._thread = threading.Thread(target=serve, name="scripted-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("scripted server did not start within 10 s")
        return self.base_url

    def stop(self) -> None:
        if self._thread is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def actions(self) -> Counter:
        return Counter(a.action for a in self.log)

    def replay(self) -> None:
        """Forget how often each key was seen: the next requests get the schedule from attempt 1."""
        self._seen.clear()

    # ------------------------------------------------------------ decisions

    def plan(self, key: str, attempt: int) -> str:
        s = self.script
        if key in s.per_key:
            seq = s.per_key[key]
            return seq[attempt - 1] if attempt <= len(seq) else "ok"
        if s.fault_rate > 0:
            h = hashlib.sha256(f"{s.seed}\0{key}\0{attempt}".encode()).digest()
            if int.from_bytes(h[:8], "big") / 2**64 < s.fault_rate:
                return s.faults[int.from_bytes(h[8:16], "big") % len(s.faults)]
        return "ok"

    def handle(self, conn: "_Conn", head: bytes, body: bytes) -> None:
        self.requests += 1
        s = self.script
        if s.canned:
            lo, hi = s.delay_s
            conn.send_later(self._rng.uniform(lo, hi) if hi > 0 else 0.0, self._canned)
            return
        request_line, _, header_block = head.partition(b"\r\n")
        parts = request_line.split(b" ")
        if len(parts) < 2 or parts[0] != b"POST" or not parts[1].endswith(b"/chat/completions"):
            conn.send_later(0, _http(404, b'{"error":{"code":404,"message":"not found"}}'))
            return
        try:
            request = json.loads(body)
            key = _key(request)
        except (ValueError, TypeError, KeyError, IndexError) as e:
            conn.send_later(0, _http(400, _error(400, f"bad request body: {e}")))
            return
        self._seen[key] += 1
        attempt = self._seen[key]
        action = self.plan(key, attempt)
        if s.api_key is not None and _bearer(header_block) != s.api_key:
            action = "http_401"
        self.log.append(Arrival(time.monotonic(), key, attempt, action))
        lo, hi = s.delay_s
        delay = self._rng.uniform(lo, hi) if hi > 0 else 0.0
        self._act(conn, action, request, key, delay, _bearer(header_block))

    def _act(self, conn: "_Conn", action: str, request: dict, key: str, delay: float,
             bearer: str | None = None) -> None:
        s = self.script
        ra = {"Retry-After": _seconds(s.retry_after_s), "retry-after-ms": str(int(s.retry_after_s * 1000))}
        if action in ECHOES:
            conn.send_later(delay, _http(200, _echo_body(request, key, s, bearer or "no-key-sent",
                                                        escaped=action == "echo_key_escaped")))
        elif action in ("ok", "slow", "keepalive_ws"):
            reply = s.replies.get(key)
            if isinstance(reply, str):
                body = reply.encode()
            else:
                body = _body_bytes(_completion(request, key, s, reply))
            if action == "keepalive_ws":
                conn.send_chunked_later(delay, [b"\n", b"   \n", body], gap_s=0.02)
            else:
                conn.send_later(delay + (s.slow_s if action == "slow" else 0.0), _http(200, body))
        elif action == "reset":
            conn.abort_later(delay)
        elif action == "timeout":
            conn.abort_later(s.hang_s)
        elif action == "error_body":
            conn.send_later(delay, _http(200, _error(502, "Upstream provider error (scripted)")))
        elif action == "empty_output":
            conn.send_later(delay, _http(200, _body_bytes(
                _completion(request, key, s, {"role": "assistant", "content": "", "reasoning": None}))))
        elif action == "finish_error":
            c = _completion(request, key, s)
            c["choices"][0]["finish_reason"] = "error"
            conn.send_later(delay, _http(200, _body_bytes(c)))
        elif action == "malformed_json":
            body = _body_bytes(_completion(request, key, s))
            conn.send_later(delay, _http(200, body[: len(body) // 2]))
        elif action in ("leaked_error_body", "content_parts_json", "content_parts_python"):
            # Billed 200s whose content is not an answer: what a correct client must not keep.
            answer = f"Answer to {key}."
            content = {"leaked_error_body": json.dumps({"error": {
                           "message": "Upstream provider error (scripted)", "code": 502,
                           "metadata": {"provider_name": s.provider}}}),
                       "content_parts_json": json.dumps([{"type": "text", "text": answer}]),
                       "content_parts_python": repr([{"type": "text", "text": answer}])}[action]
            conn.send_later(delay, _http(200, _body_bytes(
                _completion(request, key, s, {"role": "assistant", "content": content}))))
        elif action == "http_429_provider":
            meta = {"provider_name": s.provider, "raw": "rate limited upstream (scripted)", **s.error_metadata}
            conn.send_later(delay, _http(429, _error(429, f"{meta['provider_name']} is temporarily rate-limited "
                                                          "upstream (scripted)", meta), ra))
        elif action in ("error_body_paid", "http_502_paid"):
            # An error the provider billed for: the body carries usage with its cost.
            meta = {"provider_name": s.provider, "raw": "upstream failed mid-generation (scripted)",
                    **s.error_metadata}
            obj = json.loads(_error(502, "Provider returned error (scripted)", meta))
            obj["usage"] = {"prompt_tokens": 8 * len(request.get("messages", [])), "completion_tokens": 5,
                            "total_tokens": 8 * len(request.get("messages", [])) + 5, "cost": s.cost_usd}
            conn.send_later(delay, _http(200 if action == "error_body_paid" else 502, _body_bytes(obj)))
        elif action == "http_429":
            conn.send_later(delay, _http(429, _error(429, "Rate limit exceeded (scripted)"), ra))
        elif action == "http_503":
            conn.send_later(delay, _http(503, _error(503, "No provider available (scripted)"), ra))
        elif action == "http_402_inflight":
            conn.send_later(delay, _http(402, _error(402, "In-flight budget exhausted (scripted)",
                                                     {"limit_source": "openrouter_in_flight_budget"}), ra))
        elif action == "http_402_credits":
            conn.send_later(delay, _http(402, _error(402, "Insufficient credits (scripted)",
                                                     {"limit_source": "openrouter_credits"})))
        elif action == "http_403_key_limit":
            conn.send_later(delay, _http(403, _error(403, "Key limit exceeded (scripted)",
                                                     {"limit_source": "openrouter_key_limit"})))
        elif action.startswith("http_"):
            code = int(action.removeprefix("http_"))
            conn.send_later(delay, _http(code, _error(code, f"scripted {code}")))
        else:
            raise ValueError(f"unknown scripted action {action!r}; known: "
                             f"{', '.join(BENIGN + ECHOES + RETRYABLE_FAULTS + FINAL_FAULTS)}")


# ---------------------------------------------------------------- responses

def _key(request: dict) -> str:
    content = request["messages"][-1]["content"]
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


def _completion(request: dict, key: str, s: Script, message: dict | None = None) -> dict:
    quirks = set(s.quirks)
    gen = hashlib.sha256(key.encode()).hexdigest()[:24]
    if message is None:
        reasoning = f"\nThinking about {key}.\n"
        if "trim_reasoning" in quirks:
            reasoning = reasoning.strip()
        message = {"role": "assistant", "content": f"Answer to {key}.", "reasoning": reasoning}
        if "think_in_content" in quirks:
            message = {"role": "assistant", "content": f"<think>{reasoning}</think>{message['content']}",
                       "reasoning": None}
        tools = request.get("tools") or []
        if tools:
            name = tools[0]["function"]["name"]
            call_id = f"{name}:0" if "bare_tool_ids" in quirks else f"functions.{name}:0"
            message["tool_calls"] = [{"id": call_id, "type": "function", "index": 0,
                                      "function": {"name": name, "arguments": '{"a": 1}'}}]
    content = message.get("content") or ""
    completion_tokens = max(1, len(content) // 4)
    choice: dict[str, Any] = {
        "index": 0, "message": message,
        "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
        "native_finish_reason": "stop", "logprobs": None,
    }
    if request.get("logprobs") and "logprobs_null" not in quirks:
        choice["logprobs"] = {"content": [{"token": t, "logprob": -0.25, "bytes": list(t.encode()),
                                           "top_logprobs": []} for t in content.split(" ")]}
    out: dict[str, Any] = {
        "id": f"gen-{gen}", "object": "chat.completion", "created": 1700000000,
        "model": request.get("model", "") + ("-0127" if "model_slug" in quirks else ""),
        "provider": s.provider, "choices": [choice],
        "usage": {"prompt_tokens": 8 * len(request.get("messages", [])),
                  "completion_tokens": completion_tokens, "total_tokens": 0, "cost": s.cost_usd,
                  "completion_tokens_details": {"reasoning_tokens": 0},
                  "prompt_tokens_details": {"cached_tokens": 0}},
    }
    out["usage"]["total_tokens"] = out["usage"]["prompt_tokens"] + completion_tokens
    if request.get("return_token_ids"):
        choice["token_ids"] = list(content.encode())[:64] + [2]
        out["prompt_token_ids"] = [1, 2, 3]
    return out


_MARK = "KEY-ECHO-MARK"


def _echo_body(request: dict, key: str, s: Script, bearer: str, escaped: bool) -> bytes:
    """An ok answer with `bearer` in its content, reasoning, tool-call arguments, id and provider."""
    message = {"role": "assistant", "content": f"Answer to {key}. Your key is {_MARK}.",
               "reasoning": f"The request said Authorization: Bearer {_MARK}",
               "tool_calls": [{"id": "functions.echo:0", "type": "function", "index": 0,
                               "function": {"name": "echo", "arguments": json.dumps({"key": _MARK})}}]}
    c = _completion(request, key, s, message)
    c["id"], c["provider"] = f"gen-{_MARK}", f"{s.provider} ({_MARK})"
    # The key's characters, as a provider might spell them: as is, or each one \u-escaped.
    spelled = "".join(f"\\u{ord(ch):04x}" for ch in bearer) if escaped else bearer
    return _body_bytes(c).replace(_MARK.encode(), spelled.encode())


def _body_bytes(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


def _error(code: int, message: str, metadata: dict | None = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if metadata:
        err["metadata"] = metadata
    return _body_bytes({"error": err})


def _seconds(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


def _http(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def _bearer(header_block: bytes) -> str | None:
    for line in header_block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"authorization":
            v = value.strip().decode("latin-1")
            return v.removeprefix("Bearer ").strip()
    return None


# ---------------------------------------------------------------- protocol

class _Conn(asyncio.Protocol):
    """HTTP/1.1 keep-alive, Content-Length request bodies, one request at a time per connection."""

    def __init__(self, server: ScriptedServer):
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections += 1
        self.server._conns.add(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._conns.discard(self.transport)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = _content_length(head)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            self.server.handle(self, head, body)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def send_later(self, delay: float, data: bytes) -> None:
        if delay > 0:
            self.loop.call_later(delay, self._write, data)
        else:
            self._write(data)

    def send_chunked_later(self, delay: float, pieces: list[bytes], gap_s: float) -> None:
        self.send_later(delay, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n")
        for i, piece in enumerate(pieces):
            self.send_later(delay + gap_s * (i + 1), b"%x\r\n%s\r\n" % (len(piece), piece))
        self.send_later(delay + gap_s * (len(pieces) + 1), b"0\r\n\r\n")

    def abort_later(self, delay: float) -> None:
        def abort() -> None:
            if self.transport is not None:
                self.transport.abort()
        self.loop.call_later(delay, abort) if delay > 0 else abort()


def _content_length(head: bytes) -> int:
    i = head.lower().find(b"\r\ncontent-length:")
    if i < 0:
        return 0
    j = head.find(b"\r\n", i + 2)
    return int(head[i + 17:j if j >= 0 else len(head)].strip())


# ---------------------------------------------------------------- entry points

@contextlib.contextmanager
def running(script: Script | None = None) -> Iterator[ScriptedServer]:
    server = ScriptedServer(script)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground (the benchmark runs it in its own process); prints the base URL."""
    p = argparse.ArgumentParser(prog="python -m draftgate.serve.scripted")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--canned", action="store_true", help="one prebuilt answer for every request")
    p.add_argument("--delay", type=float, nargs=2, default=(0.0, 0.0), metavar=("LO", "HI"))
    p.add_argument("--fault-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    server = ScriptedServer(Script(canned=a.canned, delay_s=tuple(a.delay), fault_rate=a.fault_rate,
                                   seed=a.seed))

    async def serve() -> None:
        print(await server.start_async(port=a.port), flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
