"""A vLLM KV connector that writes each request's captured hidden states to one file (engine side).

Loaded by vLLM itself, in the engine's environment (.venv-engine), through
`kv_transfer_config={"kv_connector": "DraftgateHiddenStatesConnector",
"kv_connector_module_path": "draftgate.hidden.vllm_connector", ...}` beside
`speculative_config={"method": "extract_hidden_states", ...}` (draftgate/hidden/vllm_run.py sets
both). It imports nothing of draftgate and nothing the engine environment lacks: torch,
safetensors and vLLM's public connector interface (`KVConnectorBase_V1`).

How vLLM hands the states over (vllm 0.32, docs/engines.md "Hidden states"): the
`extract_hidden_states` method stacks the target's aux states, [tokens, layers, H], into the KV
cache of one cache-only attention layer, a "KV head" per captured layer. When a request finishes,
the scheduler side hands its block ids to the worker side (`request_finished` ->
`build_connector_meta`), which gathers its slots from that cache and writes
`<spool>/<name>.safetensors`: `hidden_states` [n, K, H] in the engine's dtype, `token_ids` [n]
(int64), metadata `layers` = the captured vLLM layer ids in the order of the K slots (vLLM
captures in ascending layer order whatever order the config gives). `name` is the request's
`kv_transfer_params["draftgate_name"]`; a request without one is not written (the repair stage's
window requests share the engine with its named base pass: draftgate/repair/engine.py).

Unlike vLLM's ExampleHiddenStatesConnector, the copy to the host is a plain blocking `.to("cpu")`
and the file is written before the request is reported done: no pinned memory (CPU torch refuses
`pin_memory=True`) and no device event (the CPU platform's placeholder has no `.query`), so the
same code runs on CPU and CUDA. The blocking copy costs a device sync per finished request, small
beside its prefill. A file appears only complete (temp name, fsync, rename): its existence is the
driver's signal.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger(__name__)

FORMAT = "draftgate.vllm-hidden/1"
NAME_PARAM = "draftgate_name"     # kv_transfer_params key naming a request's file
SPOOL_PARAM = "spool_dir"         # kv_connector_extra_config key: where files go


@dataclass
class Save:
    req_id: str
    path: str
    token_ids: list[int]
    block_ids: list[int]


@dataclass
class SaveMetadata(KVConnectorMetadata):
    saves: list[Save] = field(default_factory=list)


def spool_path(spool: str, name: str) -> str:
    """`<spool>/<name>.safetensors`; a name that could leave the folder is refused."""
    if not name or os.sep in name or name.startswith("."):
        raise ValueError(f"kv_transfer_params[{NAME_PARAM!r}] = {name!r}: give a plain file stem")
    return os.path.join(spool, f"{name}.safetensors")


class DraftgateHiddenStatesConnector(KVConnectorBase_V1, SupportsHMA):
    """Store-only: nothing is ever loaded into the engine, every finished named request is written."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        spec = vllm_config.speculative_config
        if spec is None or spec.method != "extract_hidden_states":
            raise ValueError("DraftgateHiddenStatesConnector needs speculative_config "
                             "{'method': 'extract_hidden_states', ...}: only that method caches hidden states")
        self._spool = self._kv_transfer_config.get_from_extra_config(SPOOL_PARAM, None)
        if not self._spool:
            raise ValueError(f"kv_connector_extra_config[{SPOOL_PARAM!r}] is not set: name the folder "
                             "the per-request hidden-state files go to")
        ids = getattr(spec.draft_model_config.hf_config, "eagle_aux_hidden_state_layer_ids", None) or []
        self._layers = sorted(set(int(i) for i in ids))   # the order vLLM stacks them in
        self._group = self._hidden_group(kv_cache_config)
        self._paths: dict[str, str] = {}                 # scheduler: req_id -> file
        self._saves: list[Save] = []                     # scheduler: finished, not yet sent to the worker
        self._cache: torch.Tensor | None = None          # worker: [blocks, K, block_size, H]
        self._written: set[str] = set()                  # worker: req_ids written since the last report
        self._rank0 = True

    @staticmethod
    def _hidden_group(kv_cache_config: "KVCacheConfig | None") -> int:
        """The KV cache group of the cache-only layer (its spec is HiddenStateCacheSpec)."""
        if kv_cache_config is None:
            return 0
        from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

        groups = kv_cache_config.kv_cache_groups
        found = [g for g, group in enumerate(groups) if isinstance(group.kv_cache_spec, HiddenStateCacheSpec)]
        if len(found) == 1:
            return found[0]
        if not found and len(groups) == 1:
            return 0
        raise ValueError(f"{len(found)} hidden-state KV cache groups among {len(groups)}: expected exactly one")

    # ------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        for new in scheduler_output.scheduled_new_reqs:
            extra = (new.sampling_params.extra_args or {}) if new.sampling_params else {}
            name = (extra.get("kv_transfer_params") or {}).get(NAME_PARAM)
            if name:        # unnamed: not ours to keep (repair's window requests through the same engine)
                self._paths[new.req_id] = spool_path(self._spool, name)
        meta = SaveMetadata(saves=self._saves)
        self._saves = []
        return meta

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        path = self._paths.pop(request.request_id, None)
        if path is None:          # unnamed, or aborted before it was scheduled: nothing to write
            return False, None
        # The prompt only: the sampled token was never an input, so no state of it is cached.
        self._saves.append(Save(request.request_id, path, list(request.prompt_token_ids or []), list(block_ids)))
        return True, {"hidden_states_path": path}     # True: keep the blocks until the worker wrote them

    def request_finished_all_groups(self, request: "Request",
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        if not 0 <= self._group < len(block_ids):
            return False, None
        return self.request_finished(request, block_ids[self._group])

    def get_finished_count(self) -> int:
        return 1      # only tensor-parallel rank 0 writes; the default would wait for every rank

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        return "LBNHC"    # a token's captured layers side by side (what extract_hidden_states caches)

    # ------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.config import get_layers_from_vllm_config
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

        self._rank0 = get_tensor_model_parallel_rank() == 0
        names = list(get_layers_from_vllm_config(self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches)))
        if len(names) != 1:
            raise ValueError(f"expected one cache-only layer (extract_hidden_states), found {names}")
        self._cache = kv_caches[names[0]]
        if self._cache.shape[1] != len(self._layers):
            raise ValueError(f"the hidden-state cache holds {self._cache.shape[1]} layers per token, the draft "
                             f"config names {self._layers}")

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        pass      # the states are in the cache already; they are read once the request finished

    def wait_for_save(self) -> None:
        pass

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, SaveMetadata):
                for save in meta.saves:
                    if self._rank0:
                        self._write(save)
                    self._written.add(save.req_id)
        done, self._written = self._written, set()
        return done or None, None

    def _write(self, save: Save) -> None:
        from safetensors.torch import save as st_bytes

        assert self._cache is not None
        n = len(save.token_ids)
        block = self._cache.shape[2]
        blocks = torch.as_tensor(save.block_ids, dtype=torch.long, device=self._cache.device)
        slots = (blocks[:, None] * block + torch.arange(block, device=self._cache.device)).flatten()[:n]
        if slots.numel() != n:
            raise ValueError(f"request {save.req_id}: {n} prompt tokens but blocks for {slots.numel()} slots")
        states = self._cache[slots // block, :, slots % block].to("cpu")     # blocking: no pinned memory, no event
        data = st_bytes({"hidden_states": states.contiguous(),
                         "token_ids": torch.tensor(save.token_ids, dtype=torch.int64)},
                        metadata={"format": FORMAT, "layers": json.dumps(self._layers)})
        os.makedirs(os.path.dirname(save.path), exist_ok=True)
        tmp = f"{save.path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, save.path)
