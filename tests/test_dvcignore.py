""".dvcignore: bytecode and editor files inside a code folder that a stage depends on do not make
DVC rerun the stage (a machine without PYTHONDONTWRITEBYTECODE writes __pycache__ on import)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from dvc_repo import Repo

ROOT = Path(__file__).resolve().parents[1]
STRAYS = ("__pycache__/mod.cpython-311.pyc", "mod.py~", ".mod.py.swp", ".#mod.py", "#mod.py#",
          ".ipynb_checkpoints/x.ipynb")

DVC_YAML = """
stages:
  build:
    cmd: python -c "import pathlib; pathlib.Path('out.txt').write_text(pathlib.Path('pkg/mod.py').read_text())"
    deps: [pkg]
    outs: [out.txt]
"""


def repo_with_folder_dep(root: Path) -> Repo:
    root.mkdir()
    repo = Repo(root)
    repo.run("git", "init", "-q", "-b", "main")
    repo.run("dvc", "init", "-q")
    (root / "pkg").mkdir()
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "dvc.yaml").write_text(DVC_YAML.lstrip())
    shutil.copy(ROOT / ".dvcignore", root / ".dvcignore")
    repo.run("dvc", "repro", "-q")
    return repo


def test_bytecode_and_editor_files_in_a_dependency_folder_leave_the_stage_up_to_date(tmp_path):
    repo = repo_with_folder_dep(tmp_path / "repo")
    for name in STRAYS:
        path = repo.root / "pkg" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"\x00stray")
    assert repo.run("dvc", "status", "--json").stdout.strip() == "{}"
    # The same strays without the .dvcignore: the stage's folder dep has changed.
    (repo.root / ".dvcignore").unlink()
    assert "build" in repo.run("dvc", "status", "--json").stdout


def test_the_real_pipelines_folder_deps_ignore_bytecode_but_not_code():
    deps = {d for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values()
            for d in stage.get("deps", []) if (ROOT / d).is_dir() and d.startswith("draftgate")}
    assert "draftgate/templates" in deps
    strays = [f"{d}/{name}" for d in sorted(deps) for name in STRAYS]
    code = [str(next((ROOT / d).glob("*.py")).relative_to(ROOT)) for d in sorted(deps)]
    out = Repo(ROOT).run("dvc", "check-ignore", "-d", "-n", *strays, *code, check=False).stdout
    # -d -n prints every target with the rule that matched it, "::" where none did.
    unmatched = {line.split("\t")[-1] for line in out.splitlines() if line.startswith("::")}
    assert unmatched == set(code)
