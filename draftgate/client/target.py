"""Where requests go: a remote backend from params -> a `Target` (base URL, key, headers).

`openrouter` and `openai` take the key from the environment variable `generate.api_key_env`
names, and only from there. `local` and `vllm` are not the client's business: the generate stage
starts the local server (draftgate.serve) or vLLM (draftgate.engine) and hands the client a Target
with the server's URL and identity.
Every Target carries that variable's value among its secrets (`env_secrets`), sent or not: it is
never written anywhere (client/redact.py).
"""

from __future__ import annotations

import os
import sys
from urllib.parse import urlsplit

from draftgate.client.run import Target
from draftgate.config import GenerateParams

OPENROUTER_URL = "https://openrouter.ai/api/v1"


class TargetError(ValueError):
    """A backend that cannot be used as configured; the message says what to set."""


def env_secrets(gp: GenerateParams) -> tuple[str, ...]:
    """The value of the variable generate.api_key_env names, when set: a secret whatever the backend."""
    key = os.environ.get(gp.api_key_env)
    return (key,) if key else ()


def target_for(gp: GenerateParams) -> Target:
    if gp.backend in ("local", "vllm"):
        raise TargetError(f"backend {gp.backend} has no remote target: the generate stage starts the server "
                          "(or, for vllm, uses the one at generate.base_url) and builds its Target "
                          "(stages/generate.py)")
    key = os.environ.get(gp.api_key_env) or None
    if gp.backend == "openrouter":
        if key is None:
            raise TargetError(f"environment variable {gp.api_key_env} is not set; export your OpenRouter key "
                              f"there (or point generate.api_key_env at the variable that holds it)")
        headers = {"X-Title": gp.app_title}
        if gp.http_referer:
            headers["HTTP-Referer"] = gp.http_referer
        return Target(check_key_transport(gp.base_url or OPENROUTER_URL, key, gp.api_key_env), key, headers,
                      extra_secrets=env_secrets(gp))
    if not gp.base_url:
        raise TargetError("generate.base_url is required for backend openai (e.g. http://host:8000/v1)")
    if key is None:
        print(f"generate: {gp.api_key_env} is not set; sending requests without an API key", file=sys.stderr)
    return Target(check_key_transport(gp.base_url, key, gp.api_key_env), key, extra_secrets=env_secrets(gp))


def check_key_transport(base_url: str, key: str | None, env: str) -> str:
    """A key travels only over https, or plain http to this machine (a local test server)."""
    url = urlsplit(base_url)
    if key and url.scheme != "https" and url.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise TargetError(f"generate.base_url {base_url!r} is plain http to another host: the key in {env} would "
                          "travel unencrypted; use https, or unset the variable / point generate.api_key_env "
                          "elsewhere for a server that needs no key")
    return base_url
