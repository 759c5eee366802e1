"""What the engine tests share: the engine environment's Python and the embedded default's
servable directory (draftgate/engine).

`make test` builds .venv-engine (`make engine`, ~2 min once: its stamp) and sets
DRAFTGATE_ENGINE=required, which turns a missing environment into a failure; a bare `pytest`
outside make skips the engine tests with the command to run (as DRAFTGATE_INTEROP does for
tests/test_interop.py). Each engine test file starts at most one engine (module scope, eager:
~30 s on 2 quiet cores, ~80 s under load) and keeps generation tiny.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from draftgate.engine.launch import ENGINE_VENV
from draftgate.engine.model import SERVED_NAME

__all__ = ["engine_python", "model_dir", "SERVED_NAME", "START_TIMEOUT_S"]

# A start on a loaded 2-core machine took 83 s eager (30 s quiet); the deadline is for a hung one.
START_TIMEOUT_S = 420.0


def engine_python() -> Path:
    python = ENGINE_VENV / "bin" / "python"
    if (ENGINE_VENV / ".installed").is_file() and python.is_file():
        return python
    if os.environ.get("DRAFTGATE_ENGINE") == "required":
        pytest.fail("DRAFTGATE_ENGINE=required but .venv-engine is not installed: run `make engine`")
    pytest.skip("the engine environment is not installed (make engine)")


@functools.lru_cache(maxsize=1)
def model_dir() -> Path:
    """SmolLM2-135M-Instruct as vLLM serves it: the converted weights with draftgate's tokenizer
    and chat template beside them (a cache entry; ~10 s to assemble the first time, then ~1 s)."""
    from draftgate.engine.model import servable_dir

    return servable_dir().path
