"""`repair.backend: vllm` without a base_url: the repair stage starts vLLM itself, and where the
hidden stage extracts through vLLM too, one engine request per row serves both stages.

The engine runs with the hidden backend's settings (vLLM's `extract_hidden_states`, draftgate's
KV connector; engine/spool.py `server_args`) and a prefix cache, so that a trie node is one request
that computes its own few tokens, not its row (VllmScorer's `cached_nodes`; `scoring_args`). The
search's first pass over each row (VllmScorer.score_rows) names a file in the request's
`kv_transfer_params`; the connector writes the row's captured states there, and the
rows whose ids the search kept go to the prefill (draftgate/prefill.py) exactly as the in-process
base pass's do. Window, node and re-score requests carry no name: the connector writes nothing for
them. `bench/engine_shared_prefill.py` measured the pair (logprobs within 3.8e-5 nats, features
within 1.8e-6 of the in-process target on 8 demo rows); docs/repair.md, "One prefill for two
stages", says the design.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

SPOOL = ".vllm"            # inside the prefill directory while the engine runs
FILE_WAIT_S = 120.0        # the connector writes a row one engine step after its answer
SERVED_NAME = "target"
NODE_TOP = 200             # a trie node's top k (the first pass keeps repair.top_logprobs per position)


def scoring_args(device: str) -> tuple[str, ...]:
    """Server flags for the search's trie nodes (VllmScorer `cached_nodes`) beside the prefix cache
    (engine_scorer turns it on): on CPU the cache's blocks are 128 tokens by default, so a node would
    recompute up to 127 tokens of its row; 32 is the CPU attention's smallest (its kernels take
    multiples of 32). GPUs default to 16."""
    return ("--max-logprobs", str(NODE_TOP)) + (("--block-size", "32") if device == "cpu" else ())


@dataclass
class SpoolCapture:
    """The base pass's hidden-state files: a name per row asked, read once the engine wrote it."""
    directory: Path
    layers: tuple[int, ...]
    num_layers: int
    hidden_size: int
    dtype: str
    log_path: Path | None = None
    names: dict[tuple[int, ...], str] = field(default_factory=dict)   # live rows -> file stem
    issued: set[str] = field(default_factory=set)

    def name(self, ids: Sequence[int]) -> str:
        key = tuple(ids)
        if key not in self.names:         # a row repeated in one batch: one file, written twice alike
            self.names[key] = f"b{len(self.issued):08d}"
            self.issued.add(self.names[key])
        return self.names[key]

    def reader(self, ids: Sequence[int]) -> Any:
        """A call returning (aux, final) in `dtype` once the row's file is there, or None (no file asked)."""
        import numpy as np

        name = self.names.get(tuple(ids))
        if name is None:
            return None
        path, want = self.directory / f"{name}.safetensors", np.asarray(ids, dtype=np.int64)

        def read() -> tuple[Any, Any]:
            from draftgate.engine.launch import EngineError
            from draftgate.engine.spool import read_spooled

            deadline = time.monotonic() + FILE_WAIT_S
            while not path.is_file():
                if time.monotonic() > deadline:
                    raise EngineError(f"{path}: the engine wrote no hidden states for the row {FILE_WAIT_S:.0f} s "
                                      f"after its answer; the connector failed (engine log: {self.log_path})")
                time.sleep(0.02)
            return read_spooled(path, want, self.layers, self.num_layers, self.hidden_size, self.dtype)
        return read

    def drop(self, keys: Iterable[tuple[int, ...]] | None) -> None:
        for key in list(self.names) if keys is None else keys:
            name = self.names.pop(tuple(key), None)
            if name is not None:
                (self.directory / f"{name}.safetensors").unlink(missing_ok=True)

    def strays(self) -> list[str]:
        """Files the engine wrote that no first-pass request named (a connector writing every
        request would fill the disk with the search's window requests)."""
        return sorted(p.name for p in self.directory.glob("*.safetensors") if p.stem not in self.issued)


def engine_key(engine_params: Any) -> dict[str, Any]:
    """What the engine adds to a prefill's key (the hidden stage's engine key has the same fields):
    another build or tensor-parallel split computes other bits."""
    from draftgate.engine.launch import engine_python
    from draftgate.engine.spool import engine_version
    from draftgate.prefill import engine_fields

    return engine_fields(engine_version(engine_python(engine_params.python)), engine_params.tensor_parallel)


class EngineScoring(NamedTuple):
    scorer: Any          # VllmScorer on the engine (its first pass names a file per row where `writer`)
    writer: Any          # prefill.PrefillWriter, or None (no prefill asked for)
    engine: Any          # engine.launch.Engine: its address, pid and log


@contextlib.contextmanager
def engine_scorer(params: Any, sampling: Any, prefill: Path | None) -> Iterator[EngineScoring]:
    """The scorer on an engine started here, for the length of the block. `prefill`: the
    directory the kept rows' features go to (the engine then captures them)."""
    from draftgate.engine.launch import EngineError, engine_device, engine_python, launch_settings, running_vllm
    from draftgate.engine.spool import server_args
    from draftgate.engine.target import served_model
    from draftgate.prefill import PrefillWriter, feature_key
    from draftgate.repair.score import VllmScorer
    from draftgate.target import describe_target, resolve_layers

    rp, hp = params.repair, params.hidden
    model = served_model(hp)
    settings = launch_settings(params.engine)
    capture = writer = None
    if prefill is not None:
        target = describe_target(hp)
        layers = tuple(resolve_layers(hp.layers, target.num_layers))
        writer = PrefillWriter(Path(prefill), {**feature_key(target, layers, hp.dtype), **engine_key(params.engine)})
        spool = (Path(prefill) / SPOOL).resolve()
        shutil.rmtree(spool, ignore_errors=True)
        spool.mkdir(parents=True)
        capture = SpoolCapture(spool, layers, target.num_layers, target.hidden_size, hp.dtype)
    # A prefix cache: a trie node's request then computes its own tokens, not its row's.
    flags = server_args(layers, target.num_layers, spool, prefix_cache=True) if capture else ("--enable-prefix-caching",)
    device = engine_device(engine_python(settings["python"])) if settings["device"] == "auto" else settings["device"]
    settings["extra_args"] = tuple(settings["extra_args"]) + flags + scoring_args(device)
    try:
        # The hidden engine's compute dtype where the features are kept (their key names it); else
        # the checkpoint's own (running_vllm never lets vLLM downcast).
        with running_vllm(model.path, served_name=SERVED_NAME, dtype=hp.compute_dtype if capture else None,
                          **settings) as engine:
            print(f"repair: vLLM serving {model.path} at {engine.base_url} (pid {engine.pid}, log {engine.log_path})"
                  + (f"; the first pass keeps hidden.layers {list(capture.layers)} for the hidden stage" if capture else ""))
            if capture is not None:
                capture.log_path = engine.log_path
            yield EngineScoring(VllmScorer(engine.root_url, engine.served_name, sampling, rp.top_logprobs, spool=capture,
                                           cached_nodes=True, node_top=NODE_TOP), writer, engine)
            strays = capture.strays() if capture is not None else []
            if strays:
                raise EngineError(f"{capture.directory}: the engine wrote hidden states for {len(strays)} requests repair "
                                  f"did not name (e.g. {strays[0]}); draftgate's connector writes named requests only: "
                                  "is the engine loading draftgate/hidden/vllm_connector.py from this checkout?")
    finally:
        if capture is not None:
            shutil.rmtree(capture.directory, ignore_errors=True)
