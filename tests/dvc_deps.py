"""dvc.yaml's code deps, derived from the import closure: one walk for the tool and for its test.

    .venv/bin/python tests/dvc_deps.py           # list the stages whose code deps differ; exit 1 if any
    .venv/bin/python tests/dvc_deps.py --write   # rewrite those deps in dvc.yaml

A stage's code is every draftgate/ and stages/ module its command runs, transitively: the imports
are read from the source (every `import`, in functions too; `if TYPE_CHECKING:` blocks skipped:
they never run), with each package's `__init__.py` chain (`python -m stages.gate` runs
stages/__init__.py first). A module missing from a stage's deps means `dvc repro` keeps stale
outputs after a fix to it; a stale one reruns the stage for nothing. The deps list a package's
directory when the closure holds every module under it, its files otherwise.

It lives beside tests/test_dvc_deps.py, which holds dvc.yaml equal to what it writes: a developer
tool for this repository's own dvc.yaml, not part of the installed package, and not a DVC stage.
The rewrite is textual (PyYAML drops comments): in each stage's `deps:` block, the draftgate/ and
stages/ lines are replaced by the derived ones where the first of them stood; data deps, params
and every comment stay as they were.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("draftgate", "stages")
CODE = tuple(f"{p}/" for p in PACKAGES)


def stages(text: str | None = None) -> dict[str, dict]:
    return _parsed(text if text is not None else (REPO / "dvc.yaml").read_text())


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> dict[str, dict]:
    return yaml.safe_load(text)["stages"]


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


@functools.lru_cache(maxsize=None)   # a file's imports, parsed once per process
def imported_modules(path: Path) -> frozenset[str]:
    """The draftgate/stages modules `path` imports, as dotted names (`from a import b` gives a and a.b)."""
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
    return frozenset(m for m in out if m.split(".")[0] in PACKAGES)


def _with_packages(name: str) -> list[Path]:
    """Importing a.b.c runs a/__init__, a/b/__init__, a/b/c."""
    parts = name.split(".")
    found = [module_file(".".join(parts[:i])) for i in range(1, len(parts) + 1)]
    return [f for f in found if f is not None]


def closure(entries: list[Path]) -> set[Path]:
    seen: set[Path] = set()
    todo = list(entries)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            todo.extend(f for f in _with_packages(name) if f not in seen)
    return seen


def entry_points(stage: dict) -> list[Path]:
    """The modules a stage's command runs first: `python -m stages.X` (with stages/__init__.py), or
    a `draftgate COMMAND` console script and the module it dispatches to."""
    cmd = stage["cmd"] if isinstance(stage["cmd"], str) else " ".join(stage["cmd"])
    if m := re.search(r"python -m ((?:stages|draftgate)(?:\.\w+)*)", cmd):
        return _with_packages(m.group(1))
    if m := re.match(r"draftgate (\w+)", cmd):
        from draftgate.cli import COMMANDS

        return [REPO / "draftgate" / "cli.py", *_with_packages(COMMANDS[m.group(1)][0])]
    return []


def code_deps(files: set[Path]) -> list[str]:
    """The deps that cover exactly `files`: a package directory when every module under it is among
    them (its data, e.g. the gates' vendored Data Docs assets, comes along), the files otherwise.
    Stage files first, then the library, each sorted."""
    rel = {p.relative_to(REPO).as_posix() for p in files}
    whole = set()
    for init in sorted({p for p in files if p.name == "__init__.py"}):
        d = init.parent
        if d == REPO / "draftgate" or d == REPO / "stages":
            continue     # the top packages: never all of them, and a folder dep of the repo's root is no help
        if all(p.relative_to(REPO).as_posix() in rel for p in d.rglob("*.py")):
            whole.add(d.relative_to(REPO).as_posix())
    tops = {d for d in whole if not any(d.startswith(o + "/") for o in whole)}
    out = tops | {f for f in rel if not any(f.startswith(d + "/") for d in tops)}
    return sorted(out, key=lambda d: (not d.startswith("stages/"), d))


def deps_of(stage: dict) -> list[str]:
    return [str(d if isinstance(d, str) else next(iter(d))).rstrip("/") for d in stage.get("deps", [])]


def listed_code(stage: dict) -> list[str]:
    return [d for d in deps_of(stage) if d.startswith(CODE)]


def wanted(stage: dict) -> list[str]:
    return code_deps(closure(entry_points(stage)))


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(REPO).as_posix()
    return any(rel == d or rel.startswith(d + "/") for d in deps)


def missing_deps(stage: dict) -> list[str]:
    deps = deps_of(stage)
    return sorted(p.relative_to(REPO).as_posix() for p in closure(entry_points(stage)) if not covered(p, deps))


# ------------------------------------------------------------ rewriting dvc.yaml

STAGE_LINE = re.compile(r"^  ([A-Za-z_][\w@-]*):\s*(#.*)?$")
KEY_LINE = re.compile(r"^    (\w+):")
ITEM_LINE = re.compile(r"^      - ([^\s:#]+)\s*$")


def rewrite(text: str) -> str:
    """dvc.yaml's text with each stage's code deps replaced by the derived ones (comments kept)."""
    parsed = stages(text)
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    stage, in_deps, placed = None, False, False

    def place() -> None:
        nonlocal placed
        if not placed and stage in parsed and entry_points(parsed[stage]):
            out.extend(f"      - {d}\n" for d in wanted(parsed[stage]))
        placed = True

    for line in lines:
        if m := STAGE_LINE.match(line):
            if in_deps:
                place()
            stage, in_deps, placed = m.group(1), False, False
        elif KEY_LINE.match(line):
            if in_deps:
                place()
            in_deps = line.startswith("    deps:")
        elif in_deps and (m := ITEM_LINE.match(line)) and m.group(1).startswith(CODE):
            place()
            continue                      # a code dep: replaced by the derived list
        out.append(line)
    if in_deps:
        place()
    return "".join(out)


def differing(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """stage -> (code deps to add, code deps to drop)."""
    out = {}
    for name, stage in stages(text).items():
        if not entry_points(stage):
            continue
        have, want = set(listed_code(stage)), set(wanted(stage))
        if have != want:
            out[name] = (sorted(want - have), sorted(have - want))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = REPO / "dvc.yaml"
    text = path.read_text(encoding="utf-8")
    diff = differing(text)
    if "--write" in argv:
        new = rewrite(text)
        assert not differing(new), differing(new)
        if new != text:
            sys.path.insert(0, str(REPO))
            from draftgate.io import write_text

            write_text(path, new)
        print(f"dvc.yaml: code deps of {len(diff)} stage(s) rewritten" + (f": {', '.join(diff)}" if diff else ""))
        return 0
    for name, (add, drop) in diff.items():
        print(f"{name}: add {add or '-'}; drop {drop or '-'}")
    if diff:
        print("run: .venv/bin/python tests/dvc_deps.py --write", file=sys.stderr)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
