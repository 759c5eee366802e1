"""`draftgate serve` as a subprocess: `running()` starts it on a free port and stops it.

For stages and tests that need a server for a while. It loads neither aiohttp nor the model (the
child process does), only the command's module to name it. The child is told its parent's pid and stops by itself when the
parent is gone (a stage killed with SIGKILL runs no cleanup).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from draftgate.config import ServeParams

READY = re.compile(r"ready at (http://\S+)")


@contextlib.contextmanager
def running(serve_params: ServeParams | None = None, host: str = "127.0.0.1",
            timeout_s: float = 180.0) -> Iterator[str]:
    """Run `draftgate serve` in a subprocess on a free port; yield its base URL (".../v1")."""
    # The child runs `draftgate serve` (local.main): that module, and all it loads, answers.
    from draftgate.serve import local

    params = serve_params or ServeParams()
    cmd = [sys.executable, "-m", local.__name__, "--host", host, "--port", "0", "--device", params.device,
           "--max-batch", str(params.max_batch), "--batch-wait-ms", str(params.batch_wait_ms),
           "--parent-pid", str(os.getpid())]
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryDirectory(prefix="draftgate-serve-") as logs:
        out, err = Path(logs) / "stdout", Path(logs) / "stderr"
        with open(out, "wb") as fout, open(err, "wb") as ferr:
            proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr, stdin=subprocess.DEVNULL, env=env)
        try:
            yield _wait_ready(proc, out, err, timeout_s)
        finally:
            _stop(proc)


def served_identity(base_url: str) -> dict[str, str]:
    """The identity (weights, tokenizer, template, device fingerprints) a running server reports."""
    import httpx

    listed = httpx.get(f"{base_url}/models", timeout=30).json()
    identity = next((m.get("identity") for m in listed.get("data", []) if m.get("identity")), None)
    if not isinstance(identity, dict):
        raise RuntimeError(f"{base_url}/models reports no model identity; is it a draftgate server?")
    return identity


def _wait_ready(proc: subprocess.Popen, out: Path, err: Path, timeout_s: float) -> str:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = READY.search(out.read_text(errors="replace"))
        if found:
            url = found.group(1)
            listed = httpx.get(f"{url}/models", timeout=10).json()
            if any(m.get("id") for m in listed.get("data", [])):
                return url
        if proc.poll() is not None:
            raise RuntimeError(f"local server exited with code {proc.returncode} before it was ready "
                               f"({' '.join(proc.args)}); its stderr ends with:\n{_tail(err)}")
        time.sleep(0.05)
    raise TimeoutError(f"local server not ready after {timeout_s:.0f} s ({' '.join(proc.args)}); "
                       f"its stderr ends with:\n{_tail(err)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty)"
