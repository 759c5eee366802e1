"""POST /v1/completions with a token-id prompt and `prompt_logprobs`: the scoring request in the
shape vLLM serves it, so repair (draftgate/repair/score.py VllmScorer) talks to the local server
exactly as it talks to vLLM. The answer is draftgate/repair/route.py's; it runs on the batcher's
one model thread, between generation batches, never beside one.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from draftgate.serve.http import BATCHER_KEY, LM_KEY


async def completions(request: web.Request) -> web.StreamResponse:
    from draftgate.repair.route import RouteError, score_completions_request

    lm, batcher = request.app[LM_KEY], request.app[BATCHER_KEY]
    try:
        body = await request.json()
    except json.JSONDecodeError as e:
        return web.json_response(RouteError(f"request body is not JSON: {e}").body(), status=400)
    try:
        answer = await asyncio.get_running_loop().run_in_executor(batcher.executor, score_completions_request, lm, body)
    except RouteError as e:
        return web.json_response(e.body(), status=e.status)
    return web.json_response(answer)


ROUTES = [web.post("/v1/completions", completions)]
