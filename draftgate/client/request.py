"""Prompt rows -> request bodies, and the request hash that says what made an answer.

`request_hash` covers every field that shapes the output (model, messages, tools, sampling,
max_tokens, provider routing, reasoning, seed, extra_body, backend) and nothing that does not
(the key, the URL/port, concurrency, retries, budget). For a remote API the body is all we know
of what answers (the model slug and the provider routing name it). A server that can say more
reports its identity and that goes in too: the local server's weights, tokenizer and chat
template fingerprints and its device (`Target.identity`), so new weights or a fixed tokenizer
conversion regenerate instead of resuming on answers the old ones made.

A journal line whose hash differs from the current one was produced under other params or by
another model build and is ignored on resume, so such a change regenerates. Journals written
before the identity was hashed: remote lines (identity empty) hash exactly as before and resume;
local lines no longer match and are regenerated once (free, and nothing says which weights made
them). Old lines stay in the journal and count toward the budget.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from draftgate.config import GenerateParams

# Not output-shaping: asking for usage accounting / token ids changes what comes back around the
# answer, not the answer itself.
_NOT_SHAPING = ("stream", "usage", "return_token_ids")


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    dataset: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    chars: int   # characters of messages + tools JSON: the budget's prompt-size estimate
    # The prompt's serving mode (prompts.parquet `thinking`), sent at generate.thinking_field.
    thinking: bool | None = None


def prompt_from_row(row: dict[str, Any], where: str) -> Prompt:
    try:
        messages = _loads(row["messages"])
        tools = _loads(row["tools"]) if row.get("tools") else None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: prompt {row.get('prompt_id')!r}: messages/tools are not JSON ({e}); "
                         "re-run the prompts stage") from None
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: prompt {row.get('prompt_id')!r}: messages must be a non-empty list")
    return Prompt(row["prompt_id"], row.get("dataset") or "", messages, tools,
                  len(row["messages"]) + len(row.get("tools") or ""), row.get("thinking"))


def _loads(text: str) -> Any:
    # orjson (installed with GX and DVC) parses ~3x faster and gives the same values; what it
    # refuses (lone surrogates, integers past 64 bits) json reads, or rejects with its own error.
    try:
        return _orjson_loads(text)
    except ValueError:
        return json.loads(text)


try:
    from orjson import loads as _orjson_loads
except ImportError:   # pragma: no cover
    _orjson_loads = json.loads


def build_body(prompt: Prompt, p: GenerateParams) -> dict[str, Any]:
    body: dict[str, Any] = {"model": p.model, "messages": prompt.messages, "stream": False,
                            "max_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p}
    if prompt.tools:
        body["tools"] = prompt.tools
    if p.seed is not None:
        body["seed"] = p.seed
    if p.logprobs:
        body["logprobs"] = True
        if p.top_logprobs:
            body["top_logprobs"] = p.top_logprobs
    if p.backend == "openrouter":
        if p.provider is not None:
            body["provider"] = p.provider
        if p.reasoning is not None:
            body["reasoning"] = p.reasoning
        body["usage"] = {"include": True}
    if p.backend in ("local", "vllm"):   # vLLM's extension: prompt_token_ids and each choice's token_ids
        body["return_token_ids"] = True
    if p.extra_body:
        body.update(p.extra_body)
    if p.thinking_field and prompt.thinking is not None:
        # Each row's own mode, last: a run may mix modes (prompts.thinking: both), so no single
        # extra_body setting can say it. Nested dicts are copied, never the shared extra_body's.
        *parents, leaf = p.thinking_field.split(".")
        node = body
        for key in parents:
            node[key] = dict(node[key]) if isinstance(node.get(key), dict) else {}
            node = node[key]
        node[leaf] = bool(prompt.thinking)
    return body


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_hash(body: dict[str, Any], backend: str, identity: dict[str, str] | None = None) -> str:
    shaping = {k: v for k, v in body.items() if k not in _NOT_SHAPING}
    shaping["backend"] = backend
    if identity:   # absent when empty: remote hashes stay what they were before identities
        shaping["served_by"] = identity
    return hashlib.sha256(canonical(shaping).encode()).hexdigest()


def encode_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
