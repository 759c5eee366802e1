"""A stage command run by a Python without the project's packages stops at once with the fix.

`.venv/bin/dvc repro` from a shell without the venv on PATH runs `python -m stages.X` with the
system Python; it used to die inside the stage with "No module named 'pyarrow'".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_stage_run_by_a_python_without_the_projects_packages_names_the_fix(tmp_path):
    # `python` on this PATH is an interpreter without site-packages (-S): what the system Python is.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    (bin_dir / "python").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(["sh", "-c", "python -m stages.gate expectations/prompts.json data/prompts/prompts.parquet"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "is not the project's Python: it lacks pyarrow" in proc.stderr
    assert "source .venv/bin/activate && dvc repro" in proc.stderr and "make repro" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_projects_python_runs_the_stage():
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["python", "-m", "stages.gate", "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage: python -m stages.gate" in proc.stdout
