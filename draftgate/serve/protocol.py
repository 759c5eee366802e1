"""The OpenAI chat-completions protocol of the local server: requests in, response bodies out.

Pure functions, no HTTP and no model calls: a request body is checked field by field (an
unsupported parameter is an error that names it, never silently dropped) and rendered with the
model's own chat template; a finished Generation becomes the response body. A future route
(`/v1/completions` with prompt_logprobs) puts its own request and body shapes beside these.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from draftgate.serve.model import Generation, LocalModel, Sampling, Step

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


# ---------------------------------------------------------------- records -> response

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
    return "fp-" + hashlib.sha256(json.dumps(lm.identity, sort_keys=True).encode()).hexdigest()[:16]


def usage(prompt: list[int], gen: Generation) -> dict[str, int]:
    # completion_tokens counts every generated id INCLUDING the end token: that is what serving
    # engines (vLLM, SGLang) count and bill, and it equals len(token_ids).
    return {"prompt_tokens": len(prompt), "completion_tokens": len(gen.steps),
            "total_tokens": len(prompt) + len(gen.steps)}


class CompletionIds:
    """Deterministic completion ids (`chatcmpl-<32 hex>`): the sha256 of the request body (canonical
    JSON: messages, tools, sampling, seed and every other field) and how many identical bodies this
    server answered before. A second run of the same requests gets the same ids, so
    responses.parquet is byte-reproducible; a repeated request (a retry, or an unseeded resample)
    gets a new one, as from a real engine. Memory: one counter per distinct body (~100 B).
    """

    def __init__(self) -> None:
        self._seen: Counter[bytes] = Counter()

    def next(self, body: dict[str, Any]) -> str:
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                           ensure_ascii=False).encode("utf-8")).digest()
        occurrence = self._seen[digest[:16]]
        self._seen[digest[:16]] += 1
        return "chatcmpl-" + hashlib.sha256(digest + occurrence.to_bytes(8, "little")).hexdigest()[:32]
