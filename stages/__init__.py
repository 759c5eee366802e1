"""DVC stages: one thin file per stage of dvc.yaml, `main(argv=None)`; wiring only.

dvc.yaml runs each as `python -m stages.<name>`, with whatever `python` is first on PATH. Run as
`.venv/bin/dvc repro` from a shell where the project's environment is not active, that is the
system Python, and the stage died deep inside with "No module named 'pyarrow'". So before any
stage runs, this checks that the interpreter has the project's dependencies (a lookup, no import:
~1 ms) and otherwise stops with the fix.
"""

import importlib.util
import sys

_NEEDED = ("pyarrow", "yaml", "numpy", "draftgate")


def _require_project_environment() -> None:
    missing = [m for m in _NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        sys.stderr.write(
            f"stages: {sys.executable} is not the project's Python: it lacks {', '.join(missing)}. DVC runs "
            "`python -m stages.<name>` with the first `python` on PATH, so put the project's environment there "
            "first: `source .venv/bin/activate && dvc repro`, or `make repro` (it does that for you).\n")
        raise SystemExit(2)


_require_project_environment()
