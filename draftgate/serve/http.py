"""The local server's aiohttp application: shared state, error shapes, and its routes.

`build_app` holds the model, the batcher and the completion-id counter under app keys (keys.py), turns
every RequestError (and aiohttp's own 404/405) into an OpenAI-shaped JSON error, and mounts each
route module's ROUTES: `chat` serves POST /v1/chat/completions, `score` POST /v1/completions (prompt_logprobs, for repair); GET /v1/models and GET /health
live here. A new route is a module with its handlers and a ROUTES list, added in build_app.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from draftgate.config import ServeParams
from draftgate.serve import chat, score
from draftgate.serve.batcher import Batcher
from draftgate.serve.keys import BATCHER_KEY, IDS_KEY, LM_KEY
from draftgate.serve.model import LocalModel
from draftgate.serve.protocol import CompletionIds, RequestError


def build_app(lm: LocalModel, params: ServeParams) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
    app[LM_KEY] = lm
    app[IDS_KEY] = CompletionIds()     # per server: a fresh run numbers repeats from zero again

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
    app.add_routes([*chat.ROUTES, *score.ROUTES, web.get("/v1/models", models), web.get("/health", health)])
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
