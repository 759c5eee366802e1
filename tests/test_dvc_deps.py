"""dvc.yaml's deps are the stage's code: every draftgate module a stage imports, transitively, and no other.

A module missing from a stage's deps means `dvc repro` keeps stale outputs after a fix to it (a
fixed SmolLM2 conversion in tokenizers.py left old truth ids in place); a stale one reruns a stage
for nothing. The walk is tests/dvc_deps.py's, the tool that writes those deps
(`.venv/bin/python tests/dvc_deps.py --write`): one implementation for both. Also here: the
layers (the generic gate engine imports nothing of the domain; nothing imports a layer above it).
"""

from __future__ import annotations

import pytest

from dvc_deps import (REPO, closure, code_deps, deps_of, entry_points, imported_modules, listed_code,
                      missing_deps, rewrite, stages, wanted)


@pytest.mark.parametrize("name", list(stages()))
def test_a_stages_code_deps_are_exactly_its_import_closure(name):
    stage = stages()[name]
    assert entry_points(stage), f"{name}: cannot tell which code `{stage['cmd']}` runs; teach tests/dvc_deps.py"
    missing = missing_deps(stage)
    assert not missing, (f"dvc.yaml stage {name!r} imports {', '.join(missing)} but does not list them "
                         "among its deps, so `dvc repro` keeps stale outputs after a change to them: "
                         "run .venv/bin/python tests/dvc_deps.py --write")
    assert sorted(listed_code(stage)) == sorted(wanted(stage)), (
        f"dvc.yaml stage {name!r}: code deps differ from its import closure (stale entries rerun it for "
        "nothing): run .venv/bin/python tests/dvc_deps.py --write")


def test_the_tool_rewrites_only_code_deps_and_keeps_data_deps_params_and_comments():
    text = (REPO / "dvc.yaml").read_text()
    assert rewrite(text) == text                         # dvc.yaml is what the tool writes
    stale = text.replace("      - stages/gate_hidden.py\n", "      - draftgate/cli.py\n", 1)
    stale = stale.replace("      - draftgate/checks/hidden.py\n", "", 1)
    assert stale != text and rewrite(stale) == text
    # A stage whose code deps stood among its data deps gets them back where the first one stood.
    mini = ("stages:\n  x:   # why x\n    cmd: python -m stages.gate s a\n    deps:\n      - expectations/s.json\n"
            "      - draftgate/cli.py\n      # a comment\n      - data/a\n    params:\n      - gates.s\n")
    out = rewrite(mini)
    assert out.startswith("stages:\n  x:   # why x\n    cmd: python -m stages.gate s a\n    deps:\n"
                          "      - expectations/s.json\n      - stages/__init__.py\n      - stages/gate.py\n")
    assert out.endswith("      # a comment\n      - data/a\n    params:\n      - gates.s\n")
    assert "      - draftgate/gates\n" in out and "draftgate/cli.py" not in out


def test_a_package_is_listed_as_its_folder_only_when_every_module_of_it_is_reached():
    gates = set((REPO / "draftgate" / "gates").rglob("*.py"))
    assert code_deps(gates) == ["draftgate/gates"]
    some = {REPO / "draftgate" / "gates" / "__init__.py", REPO / "draftgate" / "gates" / "result.py"}
    assert code_deps(some) == ["draftgate/gates/__init__.py", "draftgate/gates/result.py"]


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
    # Imported inside main() and target(); the tokenizers package through serve/model.py; __init__ chains.
    assert {"draftgate/tokenizers/__init__.py", "draftgate/tokenizers/smollm2.py", "draftgate/serve/model.py", "draftgate/cache.py",
            "draftgate/__init__.py", "draftgate/client/__init__.py", "draftgate/config.py"} <= rel


def test_a_missing_module_is_reported_by_name():
    stage = {"cmd": "python -m stages.generate", "deps": ["stages/generate.py", "draftgate/client"]}
    missing = missing_deps(stage)
    assert "draftgate/schema.py" in missing and any(m.startswith("draftgate/tokenizers") for m in missing)
    assert not any(m.startswith("draftgate/client/") for m in missing)     # a directory covers its modules


def test_the_client_does_not_import_the_server():
    # The stage starts the local server; the client only talks HTTP to whatever Target it is given.
    client = [p for p in (REPO / "draftgate" / "client").glob("*.py")]
    reached = {p.relative_to(REPO).as_posix() for p in closure(client)}
    assert not [p for p in reached if p.startswith("draftgate/serve/")], sorted(reached)


# ------------------------------------------------------------ layers

def _modules(folder: str) -> list:
    return sorted((REPO / folder).rglob("*.py"))


def _name(path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_generic_gate_engine_imports_only_config_io_and_itself():
    allowed = ("draftgate.gates", "draftgate.config", "draftgate.io")
    found = {f"{_name(p)} imports {m}" for p in _modules("draftgate/gates") for m in imported_modules(p)
             if m != "draftgate" and not any(_under(m, a) for a in allowed)}
    assert not found, f"draftgate/gates is the generic engine; a domain check belongs in draftgate/checks/: {sorted(found)}"


def test_no_library_module_imports_a_stage_and_only_stages_import_the_checks():
    up = {f"{_name(p)} imports {m}" for p in _modules("draftgate") for m in imported_modules(p) if _under(m, "stages")}
    assert not up, f"the library must not import the stages that wire it: {sorted(up)}"
    checks = {f"{_name(p)} imports {m}" for p in _modules("draftgate") if not _under(_name(p), "draftgate.checks")
              for m in imported_modules(p) if _under(m, "draftgate.checks")}
    assert not checks, f"a gate's checks are handed to the engine by its stage (stages/gate_*.py): {sorted(checks)}"


def test_the_layer_checks_see_an_import_made_inside_a_function():
    # stages/gate_hidden.py imports its check inside main(): the walk the layer tests use sees it.
    assert "draftgate.checks.hidden" in imported_modules(REPO / "stages" / "gate_hidden.py")
    assert _under("draftgate.checks.hidden", "draftgate.checks") and not _under("draftgate.checksum", "draftgate.checks")


def test_each_gate_runs_through_the_stage_that_hands_it_its_suites_check():
    import json
    import re

    for name, stage in stages().items():
        if not name.startswith("gate_"):
            continue
        m = re.match(r"python -m stages\.(gate\w*) (\S+)", stage["cmd"])
        assert m, f"{name}: a gate runs as `python -m stages.gate[_<check>] SUITE ...`, not {stage['cmd']!r}"
        compute = json.loads((REPO / m.group(2)).read_text()).get("compute")
        assert m.group(1) == (f"gate_{compute}" if compute else "gate"), (
            f"{name}: suite {m.group(2)} computes {compute!r}: run it through stages/gate_{compute}.py" if compute
            else f"{name}: suite {m.group(2)} is SQL-only: run it through stages/gate.py")
