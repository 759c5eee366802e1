"""POST /v1/completions with a token-id prompt and `prompt_logprobs`: the scoring request in the
shape vLLM serves it, so repair (draftgate/repair/score.py VllmScorer) talks to the local server
exactly as it talks to vLLM.

The answer is a pure function of the loaded model and the request body,
`score_completions_request(lm, body) -> dict` (raises RouteError with an HTTP status); the route
runs it on the batcher's one model thread, between generation batches, never beside one. Like
vLLM, prompt log-probabilities are RAW (the model's logits at temperature 1, no nucleus): the
client tempers them (repair/score.py's temper), so one answer serves any sampling settings. The
one generated token vLLM would add is the greedy next token (max_tokens must be 1; 0 with echo,
vLLM's echo-without-generation, returns none).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web

from draftgate.serve.keys import BATCHER_KEY, LM_KEY

MAX_PROMPT_LOGPROBS = 20    # vLLM's default --max-logprobs
KNOWN = frozenset({"model", "prompt", "max_tokens", "temperature", "prompt_logprobs", "echo", "logprobs",
                   "stream", "n", "user"})


class RouteError(ValueError):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> dict[str, Any]:
        return {"error": {"code": "invalid_request", "message": self.message, "param": self.param,
                          "type": "invalid_request_error"}}


def score_completions_request(lm: Any, body: Any) -> dict[str, Any]:
    """`lm`: serve/model.py's LocalModel (its .model, .name, .token_bytes, .context_len)."""
    import torch

    if not isinstance(body, dict):
        raise RouteError("request body must be a JSON object")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise RouteError(f"unsupported parameter {unknown[0]!r} for scoring; accepted: {', '.join(sorted(KNOWN))}",
                         unknown[0])
    if body.get("model", lm.name) != lm.name:
        raise RouteError(f"model {body.get('model')!r} is not served here; use {lm.name!r}", "model", 404)
    prompt = body.get("prompt")
    vocab = len(lm.token_bytes)
    if (not isinstance(prompt, list) or len(prompt) < 1
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in prompt)):
        raise RouteError(f"prompt must be a non-empty list of token ids in 0..{vocab - 1} (text prompts are "
                         "not scored here: send the ids you want scored)", "prompt")
    if len(prompt) >= lm.context_len:
        raise RouteError(f"prompt of {len(prompt)} tokens exceeds the context of {lm.context_len}", "prompt")
    k = body.get("prompt_logprobs")
    if k is None or isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_PROMPT_LOGPROBS:
        raise RouteError(f"prompt_logprobs must be an integer in 0..{MAX_PROMPT_LOGPROBS}", "prompt_logprobs")
    echo = body.get("echo", False) is True
    max_tokens = body.get("max_tokens", 16)
    if max_tokens != 1 and not (echo and max_tokens == 0):
        raise RouteError("max_tokens must be 1 (or 0 with echo: true): this route scores, it does not sample",
                         "max_tokens")
    if body.get("stream"):
        raise RouteError("prompt_logprobs cannot stream (as in vLLM)", "stream")
    if body.get("n", 1) != 1:
        raise RouteError("n must be 1", "n")

    x = torch.tensor([prompt], dtype=torch.long, device=lm.device)
    with torch.inference_mode():
        logp = torch.log_softmax(lm.model(input_ids=x).logits[0].float(), dim=-1)
    entries: list[dict[str, dict[str, Any]] | None] = [None]
    if len(prompt) > 1:
        step = logp[:-1]
        target = torch.tensor(prompt[1:], device=step.device)
        own = step.gather(-1, target[:, None])[:, 0]
        ranks = (step > own[:, None]).sum(-1) + 1
        top_lp, top_ids = step.topk(k, dim=-1) if k else (None, None)
        for i, tid in enumerate(prompt[1:]):
            e = {}
            if k:
                for r, (t, v) in enumerate(zip(top_ids[i].tolist(), top_lp[i].tolist())):
                    e[str(t)] = {"logprob": v, "rank": r + 1, "decoded_token": _piece(lm, t)}
            e[str(tid)] = {"logprob": float(own[i]), "rank": int(ranks[i]), "decoded_token": _piece(lm, tid)}
            entries.append(e)
    generated = [] if max_tokens == 0 else [int(logp[-1].argmax())]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": lm.name,
        "choices": [{"index": 0, "text": "".join(_piece(lm, t) for t in generated), "logprobs": None,
                     "finish_reason": "length", "token_ids": generated, "prompt_logprobs": entries,
                     "prompt_token_ids": list(prompt)}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(generated),
                  "total_tokens": len(prompt) + len(generated)},
    }


def _piece(lm: Any, token_id: int) -> str:
    return lm.token_bytes[token_id].decode("utf-8", "replace")


async def completions(request: web.Request) -> web.StreamResponse:
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
