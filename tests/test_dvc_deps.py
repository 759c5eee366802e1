"""dvc.yaml's deps are the stage's code: every draftgate module a stage imports, transitively.

A module missing from a stage's deps means `dvc repro` keeps stale outputs after a fix to it (a
fixed SmolLM2 conversion in tokenizers.py left old truth ids in place). The imports are read from
the source (every `import`, in functions too; `if TYPE_CHECKING:` blocks skipped: they never run),
with each package's `__init__.py` chain. A directory dep covers every module under it. Gate stages
run `draftgate validate`: the console script (draftgate/cli.py) and the module it dispatches to.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("draftgate", "stages")


def stages() -> dict[str, dict]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def module_file(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:` (type hints only; never executed)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def imported_modules(path: Path) -> set[str]:
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    if path.name == "__init__.py":
        package = ".".join(path.relative_to(REPO).parts[:-1])
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}   # `from pkg import module`
    return {m for m in out if m.split(".")[0] in PACKAGES}


def closure(entries: list[Path]) -> set[Path]:
    seen: set[Path] = set()
    todo = list(entries)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):   # importing a.b.c runs a/__init__, a/b/__init__, a/b/c
                found = module_file(".".join(parts[:i]))
                if found is not None and found not in seen:
                    todo.append(found)
    return seen


def entry_points(stage: dict) -> list[Path]:
    cmd = stage["cmd"] if isinstance(stage["cmd"], str) else " ".join(stage["cmd"])
    if m := re.search(r"python -m (stages\.\w+)", cmd):
        return [module_file(m.group(1))]
    if m := re.match(r"draftgate (\w+)", cmd):
        from draftgate.cli import COMMANDS

        return [REPO / "draftgate" / "cli.py", module_file(COMMANDS[m.group(1)][0])]
    return []


def deps_of(stage: dict) -> list[str]:
    return [str(d if isinstance(d, str) else next(iter(d))).rstrip("/") for d in stage.get("deps", [])]


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(REPO).as_posix()
    return any(rel == d or rel.startswith(d + "/") for d in deps)


def missing_deps(stage: dict) -> list[str]:
    deps = deps_of(stage)
    return sorted(p.relative_to(REPO).as_posix() for p in closure(entry_points(stage)) if not covered(p, deps))


@pytest.mark.parametrize("name", list(stages()))
def test_every_module_a_stage_imports_is_among_its_deps(name):
    stage = stages()[name]
    assert entry_points(stage), f"{name}: cannot tell which code `{stage['cmd']}` runs; teach this test"
    missing = missing_deps(stage)
    assert not missing, (f"dvc.yaml stage {name!r} imports {', '.join(missing)} but does not list them "
                         "among its deps: add them, or `dvc repro` keeps stale outputs after a change to them")


def produced() -> set[str]:
    """Every path some stage writes (outs, metrics, plots): a fresh clone has none of them yet."""
    return {str(o if isinstance(o, str) else next(iter(o))).rstrip("/")
            for s in stages().values() for kind in ("outs", "metrics", "plots") for o in s.get(kind, [])}


@pytest.mark.parametrize("name", list(stages()))
def test_every_dep_a_stage_lists_exists(name):
    made = produced()
    absent = [d for d in deps_of(stages()[name])
              if not (REPO / d).exists() and not d.startswith("data/") and d not in made]
    assert not absent, f"dvc.yaml stage {name!r} lists deps that do not exist: {absent}"


def test_the_walk_sees_imports_inside_functions_packages_and_relative_ones(tmp_path):
    generate = closure([REPO / "stages" / "generate.py"])
    rel = {p.relative_to(REPO).as_posix() for p in generate}
    # Imported inside main() and target(); tokenizers.py through serve/model.py; __init__ chains.
    assert {"draftgate/tokenizers.py", "draftgate/serve/model.py", "draftgate/cache.py",
            "draftgate/__init__.py", "draftgate/client/__init__.py", "draftgate/config.py"} <= rel


def test_a_missing_module_is_reported_by_name():
    stage = {"cmd": "python -m stages.generate", "deps": ["stages/generate.py", "draftgate/client"]}
    missing = missing_deps(stage)
    assert "draftgate/tokenizers.py" in missing and "draftgate/schema.py" in missing
    assert not any(m.startswith("draftgate/client/") for m in missing)     # a directory covers its modules


def test_the_client_does_not_import_the_server():
    # The stage starts the local server; the client only talks HTTP to whatever Target it is given.
    client = [p for p in (REPO / "draftgate" / "client").glob("*.py")]
    reached = {p.relative_to(REPO).as_posix() for p in closure(client)}
    assert not [p for p in reached if p.startswith("draftgate/serve/")], sorted(reached)
