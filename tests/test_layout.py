"""The house's floors, read from the imports (every `import`, in functions too: tests/dvc_deps.py).

- The library never imports a stage: stages/ import draftgate/, never the other way round.
- A stage's library never imports the library of a stage that runs after it in dvc.yaml: what two
  stages share lives below both (the shared floor), so a change to a later stage never reruns an
  earlier one and the pipeline's order is the code's order.
- The shared floor (params, I/O, schemas, metrics, caches, tokenizers, templates) imports no stage.
The arrows that still run back up are listed with where they belong; the list must stay exact, so
a new arrow fails here and a moved one asks for its line to go (docs/contributing.md, "Layout").
"""

from __future__ import annotations

from pathlib import Path

from dvc_deps import REPO, imported_modules

# The stage libraries in dvc.yaml's order, then exchange/ (the side stages export_data and
# import_hidden, outside dvc.yaml: they read hidden's shards and drafter's vocabulary, so they sit
# above both and nothing of the pipeline imports them). client/ is left out: it is generate's
# library and also the HTTP layer the engine, hidden and eval reuse.
STAGE_LIBRARIES = ("prompts", "reconstruct", "repair", "hidden", "drafter", "evaluate", "exchange")
FLOOR = ("config", "io", "schema", "metrics", "cache", "device", "tokenizers", "templates", "official", "target",
         "provider_rules")
KNOWN_UPWARD: set[tuple[str, str]] = set()


def library_of(module: str) -> str | None:
    """draftgate.repair.run -> repair; draftgate.target -> target."""
    parts = module.split(".")
    if parts[0] != "draftgate" or len(parts) < 2:
        return None
    return parts[1]


def library_files() -> list[Path]:
    return sorted((REPO / "draftgate").rglob("*.py"))


def climbs(rel: str, modules: frozenset[str] | set[str]) -> set[tuple[str, str]]:
    """(file, library it imports) for each import of `rel` that climbs: a stage library importing a
    later one's, or the floor importing a stage's."""
    own = library_of(".".join(Path(rel).with_suffix("").parts))
    found = set()
    for module in modules:
        other = library_of(module)
        if other is None or other == own or other not in STAGE_LIBRARIES:
            continue
        if own in FLOOR or (own in STAGE_LIBRARIES and STAGE_LIBRARIES.index(other) > STAGE_LIBRARIES.index(own)):
            found.add((rel, other))
    return found


def upward_imports() -> set[tuple[str, str]]:
    return set().union(*(climbs(p.relative_to(REPO).as_posix(), imported_modules(p)) for p in library_files()))


def test_no_library_module_imports_a_stage():
    bad = sorted(f"{p.relative_to(REPO)} imports {m}" for p in library_files() for m in imported_modules(p)
                 if m.split(".")[0] == "stages")
    assert bad == [], "stages/ is wiring above the library: move the shared code into draftgate/"


def test_no_module_imports_the_library_of_a_stage_that_runs_after_it_but_the_known_arrows():
    new = sorted(upward_imports() - KNOWN_UPWARD)
    assert new == [], (f"{new}: an import that climbs; move what both stages need below them "
                       "(the shared floor), as docs/contributing.md says")


def test_every_known_upward_arrow_still_exists_so_a_moved_one_leaves_the_list():
    gone = sorted(KNOWN_UPWARD - upward_imports())
    assert gone == [], f"{gone} no longer climb: delete their lines from KNOWN_UPWARD"


def test_the_rule_sees_a_stage_importing_a_later_one_and_the_floor_importing_a_stage():
    assert climbs("draftgate/reconstruct/core.py", {"draftgate.drafter.vocab", "draftgate.templates"}) \
        == {("draftgate/reconstruct/core.py", "drafter")}
    assert climbs("draftgate/io.py", {"draftgate.prompts.stream"}) == {("draftgate/io.py", "prompts")}
    assert climbs("draftgate/evaluate/run.py", {"draftgate.target", "draftgate.drafter.model"}) == set()
