"""`hidden.backend: vllm`: the planned shards' rows prefilled by vLLM, written as the in-process path writes them.

The driver (this module, draftgate's environment) plans the shards and resumes the finished ones
exactly as run.py's offline path does (shards.py), then starts one engine process in the engine's
environment (`engine.python`, default .venv-engine: `python -m draftgate.hidden.vllm_run JOB`,
with only the draftgate package on its path) for the shards still to do. The engine's connector
(vllm_connector.py) writes one safetensors file per row into a spool folder inside the output
directory; as each shard's rows are complete (`<shard>.done`), the driver reads them, proves every
row's ids equal the tokens table's (exactly), picks the configured layers' slots, casts to
`hidden.dtype` and writes the shard with shards.py's writer (same bytes-per-token accounting,
same sidecar), then deletes that shard's spool files. Rows the repair stage's engine already
prefilled (the same ids, the same engine build: run.py `_reusable`) are copied from its prefill
and never sent; a shard of copied rows only is written without the engine, which is not started
when no row needs it (docs/repair.md, "One prefill for two stages"). After the last shard the spool folder is
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
from draftgate.engine.spool import read_spooled, vllm_layers
from draftgate.hidden import vllm_run             # the engine side's script (standard library at import)

SPOOL = ".vllm"                # inside the output directory while the engine runs
LOG = "engine.log"
POLL_S = 0.05
STOP_S = 30.0                  # the engine's own shutdown (~5 s here) before it is killed


def row_name(i: int) -> str:
    return f"r{i:08d}"


def extract_with_engine(job: Any, todo: Sequence[Any]) -> dict[str, Any]:
    """Write the shards in `todo` through one engine process; the figures run.py's metrics read."""
    from draftgate.engine.launch import engine_device, engine_env, engine_python, start_watchdog, stop_group

    hp, rows, out = job.params.hidden, job.rows, job.request.out
    stats = {"tokens": 0, "forward_s": 0.0, "write_s": 0.0, "shards": 0, "seconds": 0.0,
             "reused_rows": 0, "reused_tokens": 0, "extracted_rows": 0}
    spool = (out / SPOOL).resolve()     # absolute: the engine runs with the spool as its cwd
    shutil.rmtree(spool, ignore_errors=True)
    if not todo:
        return stats
    started = time.perf_counter()
    # Rows the repair stage's engine prefilled (run.py `_reusable`: the same ids, the same engine
    # build) are copied; the engine gets the others only, and starts only if there are any.
    reuse = job.reuse
    forward = [p for p in todo if any(i not in reuse for i in p.rows)]
    for plan in todo:
        if plan not in forward:
            _write(job, plan, {}, stats)
    if not forward:
        stats["seconds"] = time.perf_counter() - started
        return stats
    spool.mkdir(parents=True)
    ep = job.params.engine
    if ep.data_parallel != 1:
        raise EngineError(f"engine.data_parallel {ep.data_parallel}: hidden.backend vllm drives one engine (vLLM's "
                          "offline LLM API); set engine.data_parallel: 1 and use engine.tensor_parallel for the GPUs")
    python = engine_python(ep.python)
    spec = {
        "model": str(Path(job.target.path).resolve()), "spool": str(spool), "dtype": hp.compute_dtype,
        "layers": sorted(vllm_layers(job.layers, job.target.num_layers)),
        "max_model_len": max(len(rows.input_ids[i]) for p in forward for i in p.rows) + 1,   # + the one sampled token
        "engine_args": {"tensor_parallel_size": ep.tensor_parallel},
        "groups": [{"name": p.name.removesuffix(".safetensors"),
                    "rows": [{"name": row_name(i), "ids": rows.input_ids[i].tolist()} for i in p.rows if i not in reuse]}
                   for p in forward],
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
        for plan in forward:
            _wait_done(proc, spool, plan.name, log_path)
            mine = [i for i in plan.rows if i not in reuse]
            _write(job, plan, {i: read_row(spool, i, rows.input_ids[i], job.layers, job.target, hp.dtype)
                               for i in mine}, stats)
            for i in mine:
                (spool / f"{row_name(i)}.safetensors").unlink()
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


def _write(job: Any, plan: Any, features: dict[int, tuple[Any, Any]], stats: dict[str, Any]) -> None:
    """One shard from the engine's rows (`features`) and the prefill's (the rest of the plan's)."""
    from draftgate.hidden.shards import shard_bytes, write_shard

    t0 = time.perf_counter()
    rows = job.rows
    copied = [i for i in plan.rows if i not in features]
    features = {**features, **{i: job.prefill.features(rows.prompt_ids[i]) for i in copied}}
    record = write_shard(job.request.out, plan, shard_bytes(rows, plan, features), job.key)
    copied_tokens = sum(len(rows.input_ids[i]) for i in copied)
    stats["write_s"] += time.perf_counter() - t0
    stats["tokens"] += record["tokens"] - copied_tokens
    stats["shards"] += 1
    stats["reused_rows"] += len(copied)
    stats["reused_tokens"] += copied_tokens
    stats["extracted_rows"] += len(plan.rows) - len(copied)


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
    proving the file holds exactly that row's ids and the layers asked for (engine/spool.py)."""
    return read_spooled(spool / f"{row_name(i)}.safetensors", ids, layers, target.num_layers, target.hidden_size, dtype)


def _wait_done(proc: subprocess.Popen, spool: Path, shard: str, log_path: Path) -> None:
    from draftgate.engine.launch import tail

    done = spool / (shard.removesuffix(".safetensors") + ".done")
    while not done.is_file():
        if proc.poll() is not None and not done.is_file():
            raise EngineError(f"the vLLM engine exited with status {proc.returncode} before {shard} was complete; "
                              f"its log: {log_path}\n{tail(log_path)}")
        time.sleep(POLL_S)
