"""OpenAI-compatible HTTP server over the local model (`draftgate serve`), and `running()`.

It plays an independent serving engine: prompts are rendered with the model's OWN Jinja chat
template (tokenizer.apply_chat_template), never with draftgate.templates, so reconstruction is
measured against a truth it did not produce. Concurrent requests are batched by one worker:
it waits up to `batch_wait_ms` for up to `max_batch` requests, then generates them together on a
single generation thread (the event loop stays free; every tokenizer call stays on the loop).

Routes: POST /v1/chat/completions (plain or SSE stream), GET /v1/models, GET /health (counters,
including batch sizes). vLLM's `return_token_ids` extension returns `prompt_token_ids` and
`choices[0].token_ids`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from aiohttp import web

from draftgate.config import ServeParams
from draftgate.serve.model import Generation, LocalModel, Sampling, Step, generate_batch

READY = re.compile(r"ready at (http://\S+)")
# Accepted and used, or accepted because they cannot change what this model generates.
KNOWN_FIELDS = frozenset({
    "model", "messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "seed", "logprobs", "top_logprobs", "return_token_ids", "stream", "stream_options", "n",
    "user", "provider", "reasoning", "usage", "parallel_tool_calls",
})
MAX_TOP_LOGPROBS = 20


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str = "invalid_request"):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "param": self.param,
                          "type": "invalid_request_error" if self.status < 500 else "server_error"}}


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    max_tokens: int | None          # None: up to the context length
    temperature: float
    top_p: float
    seed: int | None
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    stream: bool
    include_usage: bool


# ---------------------------------------------------------------- request -> records (pure)

def parse_request(body: Any, served_name: str) -> ChatRequest:
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    unknown = sorted(set(body) - KNOWN_FIELDS)
    if unknown:
        # Silently dropping e.g. `stop` or `frequency_penalty` would change what the client thinks
        # it sampled; say so instead.
        raise RequestError(f"unsupported parameter {unknown[0]!r}; the local server accepts: "
                           f"{', '.join(sorted(KNOWN_FIELDS))}", param=unknown[0])
    model = body.get("model", served_name)
    if model != served_name:
        raise RequestError(f"model {model!r} is not served here; use {served_name!r}", param="model",
                           status=404, code="model_not_found")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string role", param=f"messages[{i}]")
        if not isinstance(m.get("content"), str):
            raise RequestError(
                f"messages[{i}].content must be a string (got {type(m.get('content')).__name__}); "
                "this model's template concatenates text and the server does not flatten content parts",
                param=f"messages[{i}].content")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("tools must be a list", param="tools")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        _check_int(max_tokens, "max_tokens", 1)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0:
        raise RequestError("top_p must be in (0, 1]", param="top_p")
    seed = body.get("seed")
    if seed is not None:
        _check_int(seed, "seed", None)
        seed %= 2**64                 # torch seeds are unsigned 64-bit; OpenAI allows any integer
    logprobs = _flag(body, "logprobs")
    top_logprobs = body.get("top_logprobs") or 0
    _check_int(top_logprobs, "top_logprobs", 0)
    if top_logprobs > MAX_TOP_LOGPROBS:
        raise RequestError(f"top_logprobs must be at most {MAX_TOP_LOGPROBS}", param="top_logprobs")
    if top_logprobs and not logprobs:
        raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    n = body.get("n", 1)
    if n != 1:
        raise RequestError("n must be 1; send separate requests (each may carry its own seed)", param="n")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("stream_options must be an object", param="stream_options")
    return ChatRequest(
        messages=messages, tools=tools or None, max_tokens=max_tokens, temperature=temperature,
        top_p=top_p, seed=seed, logprobs=logprobs, top_logprobs=top_logprobs,
        return_token_ids=_flag(body, "return_token_ids"), stream=_flag(body, "stream"),
        include_usage=bool(options.get("include_usage")))


def _check_int(value: Any, name: str, low: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low):
        bound = f" >= {low}" if low is not None else ""
        raise RequestError(f"{name} must be an integer{bound}, got {value!r}", param=name)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise RequestError(f"{name} must be a number in [{low}, {high}], got {value!r}", param=name)
    return float(value)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be true or false, got {value!r}", param=name)
    return value


def render_prompt(tokenizer: Any, req: ChatRequest) -> tuple[list[int], list[str]]:
    """The model's own template -> prompt ids, plus warnings for request parts it ignores."""
    def ids(messages: list[dict], tools: list | None) -> list[int]:
        try:
            out = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                tokenize=True, return_dict=True)
        except Exception as e:   # a Jinja error names the problem in the request
            raise RequestError(f"the model's chat template cannot render these messages: {e}",
                               param="messages") from None
        return list(out["input_ids"])

    prompt = ids(req.messages, req.tools)
    extras = [f"messages[{i}].{k}" for i, m in enumerate(req.messages) for k in m if k not in ("role", "content")]
    extras += ["tools"] if req.tools else []
    warnings = []
    if extras and ids([{"role": m["role"], "content": m["content"]} for m in req.messages], None) == prompt:
        # SmolLM2's template renders neither tools nor tool calls: the model never sees them.
        warnings.append(f"the model's chat template ignores {', '.join(extras)}; the model did not see them")
    return prompt, warnings


def sampling_for(req: ChatRequest, prompt_len: int, context_len: int) -> Sampling:
    room = context_len - prompt_len
    if room < 1 or (req.max_tokens is not None and req.max_tokens > room):
        raise RequestError(
            f"prompt ({prompt_len} tokens) + max_tokens ({req.max_tokens}) exceeds the model's context "
            f"of {context_len} tokens; shorten the prompt or lower max_tokens", param="max_tokens")
    return Sampling(
        max_tokens=req.max_tokens or room, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
        top_logprobs=req.top_logprobs if req.logprobs else None)


# ---------------------------------------------------------------- records -> response (pure)

def content_ids(lm: LocalModel, gen: Generation) -> list[int]:
    ids = gen.ids
    return ids[:-1] if gen.finish_reason == "stop" else ids


def decode(lm: LocalModel, ids: list[int]) -> str:
    # skip_special_tokens=False: a special token the model wrote mid-text stays visible; no
    # clean-up of spaces, so the text is exactly the bytes of the ids.
    return lm.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def logprob_entry(lm: LocalModel, step: Step) -> dict[str, Any]:
    def piece(tid: int) -> tuple[str, list[int]]:
        raw = lm.token_bytes[tid]
        return raw.decode("utf-8", errors="replace"), list(raw)

    token, raw = piece(step.id)
    top = [{"token": piece(t)[0], "logprob": lp, "bytes": piece(t)[1]} for t, lp in step.top]
    return {"token": token, "logprob": step.logprob, "bytes": raw, "top_logprobs": top}


def completion_body(lm: LocalModel, req: ChatRequest, completion_id: str, created: int,
                    prompt: list[int], gen: Generation, warnings: list[str]) -> dict[str, Any]:
    text_ids = content_ids(lm, gen)
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": decode(lm, text_ids), "reasoning": None,
                    "tool_calls": None},   # SmolLM2 has no tool-call format: nothing to parse
        "finish_reason": gen.finish_reason,
        "native_finish_reason": gen.finish_reason,
        # Covers the content's tokens only (not the end token), so joining `bytes` gives the
        # content's UTF-8 exactly; the end token is in token_ids.
        "logprobs": {"content": [logprob_entry(lm, s) for s in gen.steps[:len(text_ids)]]} if req.logprobs else None,
    }
    body: dict[str, Any] = {
        "id": completion_id, "object": "chat.completion", "created": created, "model": lm.name,
        "provider": "local", "system_fingerprint": system_fingerprint(lm),
        "choices": [choice], "usage": usage(prompt, gen),
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt
        choice["token_ids"] = gen.ids
    if warnings:
        body["warnings"] = warnings
    return body


def system_fingerprint(lm: LocalModel) -> str:
    import hashlib

    return "fp-" + hashlib.sha256(json.dumps(lm.identity, sort_keys=True).encode()).hexdigest()[:16]


def usage(prompt: list[int], gen: Generation) -> dict[str, int]:
    # completion_tokens counts every generated id INCLUDING the end token: that is what serving
    # engines (vLLM, SGLang) count and bill, and it equals len(token_ids).
    return {"prompt_tokens": len(prompt), "completion_tokens": len(gen.steps),
            "total_tokens": len(prompt) + len(gen.steps)}


# ---------------------------------------------------------------- batching

@dataclass
class _Job:
    prompt: list[int]
    sampling: Sampling
    future: asyncio.Future
    stream: asyncio.Queue | None


@dataclass
class Batcher:
    lm: LocalModel
    max_batch: int
    wait_s: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    batch_sizes: Counter = field(default_factory=Counter)
    completion_tokens: int = 0
    busy_s: float = 0.0
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "draftgate-generate"))

    async def submit(self, prompt: list[int], sampling: Sampling, stream: asyncio.Queue | None = None) -> Generation:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Job(prompt, sampling, future, stream))
        return await future

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self.queue.get()]
            deadline = loop.time() + self.wait_s
            while len(jobs) < self.max_batch:
                try:
                    jobs.append(self.queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    jobs.append(await asyncio.wait_for(self.queue.get(), left))
                except TimeoutError:
                    break
            await self._run_batch(loop, jobs)

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job]) -> None:
        sinks = [j.stream for j in jobs]

        def on_step(row: int, step: Step) -> None:   # generation thread -> loop, in order
            if sinks[row] is not None:
                loop.call_soon_threadsafe(sinks[row].put_nowait, step)

        self.batch_sizes[len(jobs)] += 1
        start = time.perf_counter()
        try:
            gens = await loop.run_in_executor(
                self.executor, generate_batch, self.lm, [j.prompt for j in jobs], [j.sampling for j in jobs],
                on_step if any(s is not None for s in sinks) else None)
        except Exception as e:   # one bad batch must not kill the worker; every request hears why
            for j in jobs:
                if j.stream is not None:
                    j.stream.put_nowait(None)
                if not j.future.done():
                    j.future.set_exception(e)
            return
        finally:
            self.busy_s += time.perf_counter() - start
        for j, g in zip(jobs, gens):
            self.completion_tokens += len(g.steps)
            if j.stream is not None:
                j.stream.put_nowait(None)      # after every step: call_soon_threadsafe is FIFO
            if not j.future.done():
                j.future.set_result(g)

    def stats(self) -> dict[str, Any]:
        return {"requests": sum(k * v for k, v in self.batch_sizes.items()),
                "batches": sum(self.batch_sizes.values()),
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "max_batch_seen": max(self.batch_sizes, default=0),
                "completion_tokens": self.completion_tokens, "busy_s": round(self.busy_s, 3),
                "queued": self.queue.qsize()}


# ---------------------------------------------------------------- HTTP

LM_KEY = web.AppKey("lm", LocalModel)
BATCHER_KEY = web.AppKey("batcher", Batcher)


def build_app(lm: LocalModel, params: ServeParams) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
    app[LM_KEY] = lm

    async def worker(app: web.Application):
        batcher = Batcher(lm, params.max_batch, params.batch_wait_ms / 1000)
        app[BATCHER_KEY] = batcher
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        batcher.executor.shutdown(wait=True, cancel_futures=True)

    app.cleanup_ctx.append(worker)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as e:
        return web.json_response(e.body(), status=e.status)
    except web.HTTPException as e:   # unknown route or method, in OpenAI's shape
        return web.json_response(RequestError(f"{request.method} {request.path}: {e.reason}",
                                              status=e.status, code=e.reason.lower().replace(" ", "_")).body(),
                                 status=e.status)


async def models(request: web.Request) -> web.Response:
    lm = request.app[LM_KEY]
    return web.json_response({"object": "list", "data": [{
        "id": lm.name, "object": "model", "created": 0, "owned_by": "draftgate",
        "max_model_len": lm.context_len, "identity": lm.identity}]})


async def health(request: web.Request) -> web.Response:
    lm = request.app[LM_KEY]
    return web.json_response({"status": "ok", "model": lm.name, "device": lm.device,
                              "gguf_sha256": lm.gguf_sha256, "identity": lm.identity,
                              **request.app[BATCHER_KEY].stats()})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    lm, batcher = request.app[LM_KEY], request.app[BATCHER_KEY]
    try:
        body = await request.json()
    except ValueError as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None
    req = parse_request(body, lm.name)
    prompt, warnings = render_prompt(lm.tokenizer, req)
    sampling = sampling_for(req, len(prompt), lm.context_len)
    completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if req.stream:
        return await _stream(request, lm, batcher, req, completion_id, created, prompt, sampling, warnings)
    try:
        gen = await batcher.submit(prompt, sampling)
    except Exception as e:
        raise RequestError(f"generation failed: {type(e).__name__}: {e}", status=500, code="server_error") from e
    return web.json_response(completion_body(lm, req, completion_id, created, prompt, gen, warnings))


async def _stream(request: web.Request, lm: LocalModel, batcher: Batcher, req: ChatRequest, completion_id: str,
                  created: int, prompt: list[int], sampling: Sampling, warnings: list[str]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    head = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": lm.name,
            "provider": "local"}

    async def send(choice: dict | None, **extra: Any) -> None:
        chunk = {**head, "choices": [choice] if choice else [], **extra}
        await response.write(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n")

    steps: asyncio.Queue = asyncio.Queue()
    job = asyncio.ensure_future(batcher.submit(prompt, sampling, steps))
    first = {"prompt_token_ids": prompt} if req.return_token_ids else {}
    if warnings:
        first["warnings"] = warnings
    await send({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}, **first)
    ids: list[int] = []
    sent = ""
    while (step := await steps.get()) is not None:
        is_end = step.id in lm.end_ids
        if not is_end:
            ids.append(step.id)
        text = decode(lm, ids)
        # Hold back a trailing U+FFFD: the next token may complete that UTF-8 character.
        delta = "" if text.endswith("\ufffd") else text[len(sent):]
        sent += delta
        choice: dict[str, Any] = {"index": 0, "delta": {"content": delta} if delta else {}, "finish_reason": None}
        if req.return_token_ids:
            choice["token_ids"] = [step.id]
        if req.logprobs and not is_end:
            choice["logprobs"] = {"content": [logprob_entry(lm, step)]}
        await send(choice)
    try:
        gen = await job
    except Exception as e:
        await send(None, error={"code": "server_error", "message": f"generation failed: {type(e).__name__}: {e}"})
        await response.write(b"data: [DONE]\n\n")
        return response
    rest = decode(lm, ids)[len(sent):]
    await send({"index": 0, "delta": {"content": rest} if rest else {}, "finish_reason": gen.finish_reason,
                "native_finish_reason": gen.finish_reason})
    if req.include_usage:
        await send(None, usage=usage(prompt, gen))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


# ---------------------------------------------------------------- CLI

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="draftgate serve", description="serve the local model behind an OpenAI-compatible API")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed when ready)")
    parser.add_argument("--params", help="params.yaml whose `serve` section to use (flags below override it)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--max-batch", type=int)
    parser.add_argument("--batch-wait-ms", type=int)
    parser.add_argument("--parent-pid", type=int,
                        help="exit when this process is gone (the stage that started the server was killed)")
    return parser.parse_args(argv)


def serve_params_from(args: argparse.Namespace) -> ServeParams:
    import dataclasses

    from draftgate.config import load_params

    base = load_params(args.params).serve if args.params else ServeParams()
    overrides = {k: v for k, v in {"device": args.device, "max_batch": args.max_batch,
                                   "batch_wait_ms": args.batch_wait_ms}.items() if v is not None}
    params = dataclasses.replace(base, **overrides)
    if params.max_batch < 1 or params.batch_wait_ms < 0:
        raise ValueError(f"serve.max_batch must be >= 1 and serve.batch_wait_ms >= 0, got {params}")
    return params


def main(argv: list[str] | None = None) -> int:
    from draftgate.config import ParamsError
    from draftgate.serve.model import load

    args = parse_args(argv)
    try:
        params = serve_params_from(args)
    except (ParamsError, ValueError) as e:
        print(f"draftgate serve: {e}", file=sys.stderr)
        return 2
    try:   # bind before the model loads: a bad host or busy port fails in milliseconds
        sock = socket.create_server((args.host, args.port))
    except OSError as e:
        print(f"draftgate serve: cannot listen on {args.host}:{args.port}: {e}; pick another --host/--port "
              "(--port 0 picks a free one)", file=sys.stderr)
        return 1
    try:
        lm = load(params.device)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"draftgate serve: cannot load the model: {e}", file=sys.stderr)
        return 1
    asyncio.run(_serve(lm, params, sock, args.parent_pid))
    # A batch may still be generating in the executor thread; its answers have no one to go to
    # (the client journals only what it received), so exit now instead of joining the thread.
    sys.stdout.flush()
    os._exit(0)


async def _serve(lm: LocalModel, params: ServeParams, sock: socket.socket, parent_pid: int | None = None) -> None:
    runner = web.AppRunner(build_app(lm, params), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    host, port = sock.getsockname()[:2]
    print(f"draftgate serve: {lm.name} on {lm.device} (loaded from {lm.source} in {lm.load_s:.1f} s), "
          f"max_batch {params.max_batch}, ready at http://{_url_host(host)}:{port}/v1", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    if parent_pid is not None:
        asyncio.get_running_loop().create_task(_stop_when_orphaned(parent_pid, stop))
    await stop.wait()
    try:   # bounded: an in-flight generation does not hold the shutdown
        await asyncio.wait_for(runner.cleanup(), timeout=2.0)
    except asyncio.TimeoutError:
        pass


async def _stop_when_orphaned(parent_pid: int, stop: asyncio.Event, every_s: float = 0.5) -> None:
    """A stage killed with SIGKILL runs no cleanup; its server must not outlive it and hold the CPU.
    Orphaned, a process is re-parented, so its parent pid changes."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            print(f"draftgate serve: parent process {parent_pid} is gone; stopping", file=sys.stderr, flush=True)
            stop.set()
            return
        await asyncio.sleep(every_s)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# ---------------------------------------------------------------- running()

@contextlib.contextmanager
def running(serve_params: ServeParams | None = None, host: str = "127.0.0.1",
            timeout_s: float = 180.0) -> Iterator[str]:
    """Run `draftgate serve` in a subprocess on a free port; yield its base URL (".../v1")."""
    params = serve_params or ServeParams()
    cmd = [sys.executable, "-m", "draftgate", "serve", "--host", host, "--port", "0", "--device", params.device,
           "--max-batch", str(params.max_batch), "--batch-wait-ms", str(params.batch_wait_ms),
           "--parent-pid", str(os.getpid())]
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryDirectory(prefix="draftgate-serve-") as logs:
        out, err = Path(logs) / "stdout", Path(logs) / "stderr"
        with open(out, "wb") as fout, open(err, "wb") as ferr:
            proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr, stdin=subprocess.DEVNULL, env=env)
        try:
            yield _wait_ready(proc, out, err, timeout_s)
        finally:
            _stop(proc)


def served_identity(base_url: str) -> dict[str, str]:
    """The identity (weights, tokenizer, template, device fingerprints) a running server reports."""
    import httpx

    listed = httpx.get(f"{base_url}/models", timeout=30).json()
    identity = next((m.get("identity") for m in listed.get("data", []) if m.get("identity")), None)
    if not isinstance(identity, dict):
        raise RuntimeError(f"{base_url}/models reports no model identity; is it a draftgate server?")
    return identity


def _wait_ready(proc: subprocess.Popen, out: Path, err: Path, timeout_s: float) -> str:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = READY.search(out.read_text(errors="replace"))
        if found:
            url = found.group(1)
            listed = httpx.get(f"{url}/models", timeout=10).json()
            if any(m.get("id") for m in listed.get("data", [])):
                return url
        if proc.poll() is not None:
            raise RuntimeError(f"local server exited with code {proc.returncode} before it was ready "
                               f"({' '.join(proc.args)}); its stderr ends with:\n{_tail(err)}")
        time.sleep(0.05)
    raise TimeoutError(f"local server not ready after {timeout_s:.0f} s ({' '.join(proc.args)}); "
                       f"its stderr ends with:\n{_tail(err)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty)"
