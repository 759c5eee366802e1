"""`generate.backend: vllm`: the client Target of a vLLM server, started on the target for the run
or already running at `generate.base_url`.

Started here, it serves the target the hidden stage reads (`hidden.kind`/`hidden.path`: the
embedded SmolLM2 as `model.servable_dir()`, or an HF directory as given), under `generate.model`
as its name, with the `engine` section's settings. Its identity has the local server's keys
(weights, tokenizer and chat-template fingerprints, device), so each request hash names the
exact bytes served and the hidden stage's `check_served` can prove the responses came from the
weights it reads. A running server at base_url is named by what it reports (model, root path,
vLLM version): draftgate cannot see its weights.

The ids: the client sends `return_token_ids` (client/request.py) and the journal keeps the
answer's `prompt_token_ids` and per-choice `token_ids` as they came; the responses table's
`truth_ids` and `prompt_token_ids` hold them, and reconstruct quarantines a row whose served
prompt ids differ from draftgate's rendering (`prompt_ids_differ`), exactly as for `local`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from draftgate.client.run import Target
from draftgate.client.target import TargetError, check_key_transport, env_secrets


@dataclass(frozen=True)
class ServedModel:
    path: Path                  # the directory vLLM loads (weights, config, tokenizer, template)
    identity: dict[str, str]    # weights, tokenizer, chat_template: the local server's keys less the device


def served_model(hidden_params: Any) -> ServedModel:
    """The target as vLLM loads it: `hidden.kind` embedded or hf_dir (`hidden.path`)."""
    from draftgate import cache
    from draftgate.io import text_sha256

    if hidden_params.kind == "embedded":
        from draftgate.engine.model import servable_dir
        from draftgate.serve.model import cached_weights, smollm2_tokenizer

        # The same weights entry and tokenizer the local server loads: equal fingerprints.
        entry, weights, tok = servable_dir(), cached_weights(), smollm2_tokenizer()
        return ServedModel(entry.path, {"weights": weights.fingerprint, "tokenizer": tok.fingerprint,
                                        "chat_template": text_sha256(tok.hf.chat_template or "")})
    from draftgate.config import TokenizerParams
    from draftgate.tokenizers import load_tokenizer

    path = Path(hidden_params.path or "")
    if not (path / "config.json").is_file():
        raise TargetError(f"hidden.path {hidden_params.path!r} is not an HF model directory (no config.json): "
                          "generate.backend vllm serves the target the hidden stage reads; point hidden.path at it")
    files = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files:
        raise TargetError(f"{path}: no *.safetensors or *.bin weight files for vLLM to load")
    tok = load_tokenizer(TokenizerParams(kind="hf_dir", path=str(path),
                                         trust_remote_code=hidden_params.trust_remote_code))
    # draftgate/target.py's weights_fingerprint recipe: sha256 over each weight file's name and sha256.
    weights = cache.fingerprint({p.name: cache.file_sha256(p) for p in files})
    return ServedModel(path, {"weights": weights, "tokenizer": tok.fingerprint,
                              "chat_template": text_sha256(tok.hf.chat_template or "")})


def running_identity(base_url: str, model: str, api_key: str | None = None) -> dict[str, str]:
    """What a running vLLM reports about itself; refuses one that does not serve `model`."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        listed = httpx.get(f"{base_url}/models", headers=headers, timeout=30).json()
        version = httpx.get(f"{base_url.removesuffix('/v1')}/version", headers=headers, timeout=30).json()
    except (httpx.HTTPError, ValueError) as e:
        raise TargetError(f"generate.base_url {base_url}: cannot read /models and /version ({e}); is vLLM "
                          "running there? (null starts one on the target)") from None
    served = {m.get("id"): m for m in listed.get("data", []) if isinstance(m, dict)}
    if model not in served:
        raise TargetError(f"generate.model {model!r} is not served at {base_url} (it serves {sorted(served)}); "
                          "set generate.model to the served name")
    return {"engine": "vllm", "version": str(version.get("version")), "model": model,
            "root": str(served[model].get("root"))}


@contextlib.contextmanager
def generate_target(params: Any) -> Iterator[Target]:
    """The Target for `generate.backend: vllm`, for the length of the block."""
    from draftgate.engine.launch import launch_settings, running_vllm

    gp = params.generate
    if gp.base_url:
        key = os.environ.get(gp.api_key_env) or None
        url = check_key_transport(gp.base_url, key, gp.api_key_env)
        yield Target(url, key, identity=running_identity(url, gp.model, key), extra_secrets=env_secrets(gp))
        return
    model = served_model(params.hidden)
    # No key is sent to the engine we start, but one in the environment is never written.
    with running_vllm(model.path, served_name=gp.model, **launch_settings(params.engine)) as engine:
        print(f"generate: vLLM serving {model.path} at {engine.base_url} (pid {engine.pid}, log {engine.log_path})")
        yield Target(engine.base_url, identity={**model.identity, "device": engine.device},
                     extra_secrets=env_secrets(gp))
