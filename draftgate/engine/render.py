"""`contract.engine: vllm`: the serving engine's own rendering of the template contract's probes.

vLLM builds a chat request's prompt ids itself (its own message preprocessing, the served
directory's chat template or a `--chat-template` override, its tokenizer call); the generate
stage's prompt ids are whatever that built. `/v1/chat/completions/render` returns exactly those
ids for a chat request without generating (vllm/entrypoints/scale_out/render: the server's own
`render_chat_request`, which `/v1/chat/completions` runs too), so the contract asks it for every
probe the code template renders and holds the ids equal to draftgate's (draftgate/contract.py).

vLLM 0.32 registers the endpoint only with `--enable-scale-out`; without it the route answers 403
(FACTS, "The real vLLM on this CPU"). An engine started here carries the flag; a running one at
`generate.base_url` must have been started with it, and the 403 says so.

The engine is generate's (`rendering_engine`): the vLLM at `generate.base_url` when
`generate.backend` is vllm and a base_url is set (the server that generates the data), else one
started on the target for the stage exactly as generate starts it (engine/target.py
`served_model`, the `engine` section, `generate.model` as its name).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from draftgate.engine.launch import EngineError

RENDER_PATH = "/v1/chat/completions/render"
SCALE_OUT_FLAG = "--enable-scale-out"      # registers RENDER_PATH on vLLM 0.32's OpenAI server


@dataclass(frozen=True)
class RenderServer:
    root_url: str                 # without /v1
    model: str                    # the served name requests carry
    identity: dict[str, str]      # what contract.json records about the engine
    api_key: str | None = None


@dataclass(frozen=True)
class Rendered:
    """The engine's answer for one conversation: its prompt ids, or why it refused (HTTP 400)."""
    ids: tuple[int, ...] | None
    detail: str | None = None


def render_body(model: str, messages: list[dict], tools: list[dict] | None, kwargs: dict) -> dict[str, Any]:
    """A chat request as generate sends one, less sampling: the engine adds the generation prompt
    (its default, as on /v1/chat/completions) and the template kwargs of the serving mode."""
    body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body


def render_all(server: RenderServer, requests: Sequence[tuple[list[dict], list[dict] | None, dict]],
               timeout_s: float = 60.0) -> list[Rendered]:
    """The engine's prompt ids for each (messages, tools, template kwargs), in order. A
    conversation the engine refuses (400) is answered with its message; any other failure raises
    EngineError naming the fix (a 403: the flag; a 404: a vLLM without the endpoint)."""
    import httpx

    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    url = server.root_url + RENDER_PATH
    out = []
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        for messages, tools, kwargs in requests:
            try:
                r = client.post(url, json=render_body(server.model, messages, tools, kwargs))
            except httpx.HTTPError as e:
                raise EngineError(f"{url}: {type(e).__name__}: {e}; is vLLM running there?") from None
            if r.status_code == 400:
                out.append(Rendered(None, _message(r)))
                continue
            if r.status_code == 403:
                raise EngineError(f"{url} answered 403 ({_message(r)}): vLLM serves its render endpoint only with "
                                  f"{SCALE_OUT_FLAG}; restart the server at {server.root_url} with it (an engine "
                                  "draftgate starts carries it), or set contract.engine: off")
            if r.status_code == 404:
                raise EngineError(f"{url} answered 404: this vLLM has no {RENDER_PATH} (0.32 has it, behind "
                                  f"{SCALE_OUT_FLAG}); upgrade the engine or set contract.engine: off")
            if r.status_code != 200:
                raise EngineError(f"{url} answered {r.status_code}: {_message(r)}")
            ids = r.json().get("token_ids")
            if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
                raise EngineError(f"{url}: the answer has no \"token_ids\" list of ints ({r.text[:200]!r}); "
                                  "this vLLM renders in another shape")
            out.append(Rendered(tuple(ids)))
    return out


def _message(r: Any) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:300]
    error = body.get("error") if isinstance(body, dict) else None
    found = error.get("message") if isinstance(error, dict) else body.get("message") if isinstance(body, dict) else None
    return str(found if found is not None else body)[:300]


@contextlib.contextmanager
def rendering_engine(params: Any) -> Iterator[RenderServer]:
    """The engine whose rendering the contract compares with, for the length of the block."""
    from draftgate.client.target import check_key_transport
    from draftgate.engine.launch import launch_settings, running_vllm
    from draftgate.engine.target import running_identity, served_model

    gp = params.generate
    if gp.backend == "vllm" and gp.base_url:
        key = os.environ.get(gp.api_key_env) or None
        url = check_key_transport(gp.base_url, key, gp.api_key_env)
        identity = {**running_identity(url, gp.model, key), "base_url": url}
        yield RenderServer(url.removesuffix("/v1"), gp.model, identity, key)
        return
    model = served_model(params.hidden)
    settings = launch_settings(params.engine)
    settings["extra_args"] = (*settings["extra_args"], SCALE_OUT_FLAG)
    with running_vllm(model.path, served_name=gp.model, **settings) as engine:
        print(f"contract: vLLM serving {model.path} at {engine.base_url} for its rendering (pid {engine.pid}, "
              f"log {engine.log_path})")
        version = _version(engine.root_url)
        yield RenderServer(engine.root_url, gp.model, {"engine": "vllm", "version": version, "model": gp.model,
                                                       "started": "on the target", **model.identity})


def _version(root_url: str) -> str:
    import httpx

    with contextlib.suppress(httpx.HTTPError, ValueError):
        return str(httpx.get(f"{root_url}/version", timeout=30).json().get("version"))
    return "unknown"
