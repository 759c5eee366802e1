"""`draftgate serve`: the local model behind an OpenAI-compatible HTTP API.

It plays an independent serving engine: prompts are rendered with the model's OWN Jinja chat
template (tokenizer.apply_chat_template), never with draftgate.templates, so reconstruction is
measured against a truth it did not produce. The pieces: `protocol` (request parsing, response
bodies, completion ids), `batcher` (dynamic batching on one generation thread), `http` (the app
and its routes), `chat` (POST /v1/chat/completions), `process` (`running()`: this command as a
subprocess). This module is the command: arguments, bind, load, serve until a signal.

Routes: POST /v1/chat/completions (plain or SSE stream), GET /v1/models, GET /health (counters,
including batch sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from typing import Any

from draftgate.config import ServeParams


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


async def _serve(lm: Any, params: ServeParams, sock: socket.socket, parent_pid: int | None = None) -> None:
    from aiohttp import web

    from draftgate.serve.http import build_app

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


if __name__ == "__main__":   # how process.running() starts it
    sys.exit(main())
