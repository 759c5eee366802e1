"""The README is a front door a newcomer finishes: its real-target settings are accepted as written,
its gates are dvc.yaml's in order, every link resolves, and each docs page is linked once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from draftgate.config import ParamsError, load_params, parse_params, read_yaml

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def merged(base: dict, over: dict) -> dict:
    """`over` merged into `base` section by section, as a user merges the README's block into params.yaml."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def readme_settings() -> dict:
    blocks = re.findall(r"^```yaml\n(.*?)^```$", README, flags=re.M | re.S)
    assert len(blocks) == 1, f"README.md holds {len(blocks)} yaml blocks; the real-target settings are the one"
    return read_yaml(blocks[0])


def test_the_readme_is_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_the_real_target_settings_are_accepted_merged_into_the_committed_params():
    base = read_yaml((REPO / "params.yaml").read_text(encoding="utf-8"))
    params = parse_params(merged(base, readme_settings()), source="README.md")
    assert (params.generate.backend, params.tokenizer.kind, params.template.name) == ("openrouter", "hf_dir", "kimi_k25")
    assert params.generate.max_tokens < params.prompts.context_tokens


def test_the_same_settings_without_the_targets_context_are_refused_naming_the_fix():
    # The issue's report: max_tokens 16384 against SmolLM2's context 8192, as the README once had it.
    base = read_yaml((REPO / "params.yaml").read_text(encoding="utf-8"))
    settings = readme_settings()
    settings["prompts"] = {k: v for k, v in settings["prompts"].items() if k != "context_tokens"}
    with pytest.raises(ParamsError, match=r"generate.max_tokens: 16384 leaves no room .*prompts.context_tokens 8192"):
        parse_params(merged(base, settings), source="README.md")


def test_the_committed_params_load():
    load_params(REPO / "params.yaml")


def test_the_gates_are_listed_in_dvc_yamls_order():
    stages = list(read_yaml((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
    table = README.split("## What you get", 1)[1].split("\n## ", 1)[0]
    listed = list(dict.fromkeys(re.findall(r"`(gate_\w+)`", table)))
    assert listed == [s for s in stages if s.startswith("gate_")]
    rows = [m for m in re.findall(r"^\| `(\w+)` \|", table, flags=re.M)]
    assert rows == [s for s in stages if not s.startswith("gate_")]


def test_every_link_resolves_and_each_docs_page_is_linked_once():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links, "no links found"
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    pages = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
    counts = {page: links.count(page) for page in pages}
    assert {page: n for page, n in counts.items() if n != 1} == {}, "each docs page linked exactly once"
