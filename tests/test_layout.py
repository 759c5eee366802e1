"""The house's floors, read from the imports (every `import`, in functions too: tests/dvc_deps.py).

- The library never imports a stage: stages/ import draftgate/, never the other way round.
- Three levels, each importing only its own and those below: the shared floor (params, I/O,
  schemas, metrics, caches, tokenizers, templates, the provider rules), the services several
  stages call (the HTTP client, the local server, the engine launcher, the target loader), then
  the stage libraries in dvc.yaml's order. A stage's library never imports the library of a stage
  that runs after it: what two stages share lives below both, so a change to a later stage never
  reruns an earlier one and the pipeline's order is the code's order.
- No circle: no two modules of draftgate/ reach each other through their imports. An import
  inside a function counts (it is a dependency all the same, and dvc.yaml's deps count it), so a
  circle is not hidden by moving one of its imports into a function.
"""

from __future__ import annotations

from pathlib import Path

from dvc_deps import REPO, imported_modules, module_file

FLOOR = ("config", "io", "schema", "metrics", "cache", "device", "tokenizers", "templates", "official",
         "provider_rules", "prefill")
SERVICES = ("client", "serve", "engine", "target")
# The stage libraries in dvc.yaml's order, then exchange/ (the side stages export_data and
# import_hidden, outside dvc.yaml: they read hidden's shards and drafter's vocabulary, so they sit
# above both and nothing of the pipeline imports them) and lineage/ (the report, last).
STAGE_LIBRARIES = ("contract", "prompts", "reconstruct", "repair", "hidden", "drafter", "evaluate", "exchange",
                   "lineage")
# Each library's rank: a module may import a library of its own rank or below, never above.
RANK = {**{lib: 0 for lib in FLOOR}, **{lib: 1 for lib in SERVICES},
        **{lib: 2 + i for i, lib in enumerate(STAGE_LIBRARIES)}}


def library_of(module: str) -> str | None:
    """draftgate.repair.run -> repair; draftgate.target -> target."""
    parts = module.split(".")
    if parts[0] != "draftgate" or len(parts) < 2:
        return None
    return parts[1]


def library_files() -> list[Path]:
    return sorted((REPO / "draftgate").rglob("*.py"))


def climbs(rel: str, modules: frozenset[str] | set[str]) -> set[tuple[str, str]]:
    """(file, library it imports) for each import of `rel` that climbs: to a library ranked above
    the file's own (a later stage's, a stage's from a service or the floor, a service's from the
    floor). gates/ and checks/ are held by tests/test_dvc_deps.py, cli.py sits above everything."""
    own = library_of(".".join(Path(rel).with_suffix("").parts))
    found = set()
    for module in modules:
        other = library_of(module)
        if own in RANK and other in RANK and other != own and RANK[other] > RANK[own]:
            found.add((rel, other))
    return found


def upward_imports() -> set[tuple[str, str]]:
    return set().union(*(climbs(p.relative_to(REPO).as_posix(), imported_modules(p)) for p in library_files()))


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def import_graph(files: list[Path]) -> dict[str, set[str]]:
    """module -> the draftgate modules it imports (`from pkg import name` counts pkg/name.py when it
    is a module, pkg/__init__.py otherwise)."""
    graph = {}
    for path in files:
        me = module_name(path)
        targets = {module_name(f) for m in imported_modules(path) if (f := module_file(m)) is not None}
        graph[me] = {t for t in targets if t != me and t.startswith("draftgate")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_library_module_imports_a_stage():
    bad = sorted(f"{p.relative_to(REPO)} imports {m}" for p in library_files() for m in imported_modules(p)
                 if m.split(".")[0] == "stages")
    assert bad == [], "stages/ is wiring above the library: move the shared code into draftgate/"


def test_every_library_has_a_rank():
    unranked = {library_of(module_name(p)) for p in library_files()} - set(RANK) - {
        None, "__main__", "cli", "gates", "checks"}
    assert not unranked, f"{sorted(unranked)}: give each a rank in tests/test_layout.py (docs/contributing.md, 'Layout')"


def test_no_module_imports_a_module_of_a_stage_above_it():
    up = sorted(upward_imports())
    assert up == [], (f"{up}: an import that climbs; move what both need below them "
                      "(the shared floor), as docs/contributing.md says")


def test_the_rule_sees_a_stage_importing_a_later_one_and_the_floor_importing_a_stage():
    assert climbs("draftgate/reconstruct/core.py", {"draftgate.drafter.vocab", "draftgate.templates"}) \
        == {("draftgate/reconstruct/core.py", "drafter")}
    assert climbs("draftgate/io.py", {"draftgate.prompts.stream"}) == {("draftgate/io.py", "prompts")}
    assert climbs("draftgate/schema.py", {"draftgate.serve.model"}) == {("draftgate/schema.py", "serve")}
    assert climbs("draftgate/serve/score.py", {"draftgate.repair.score"}) == {("draftgate/serve/score.py", "repair")}
    assert climbs("draftgate/evaluate/run.py", {"draftgate.target", "draftgate.drafter.model"}) == set()


def test_no_two_modules_import_each_other_even_through_others_or_inside_functions():
    found = circles(import_graph(library_files()))
    assert found == [], (f"{found}: modules that import each other; move what they share into a module "
                         "both import (serve/keys.py is the model)")


def test_the_circle_check_sees_a_planted_circle_made_inside_a_function(tmp_path, monkeypatch):
    # Three modules in a throwaway package: a imports b at the top, b imports c, c imports a lazily.
    import dvc_deps

    pkg = tmp_path / "draftgate" / "planted"
    pkg.mkdir(parents=True)
    (tmp_path / "draftgate" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from draftgate.planted import b\n")
    (pkg / "b.py").write_text("import draftgate.planted.c\n")
    (pkg / "c.py").write_text("def f():\n    from draftgate.planted.a import x\n")
    (pkg / "d.py").write_text("from draftgate.planted import a\n")     # reaches the circle, not in it
    monkeypatch.setattr(dvc_deps, "REPO", tmp_path)
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    graph = import_graph(sorted(pkg.glob("*.py")))
    assert circles(graph) == [["draftgate.planted.a", "draftgate.planted.b", "draftgate.planted.c"]]
    del graph["draftgate.planted.c"]
    assert circles(graph) == []
