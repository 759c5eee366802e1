"""Suites: a name or a file, parsed strictly, $PARAMETER resolved from params.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftgate.gates import validate
from draftgate.gates.suite import GateError, find_suite, load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITE = {"name": "tokens", "expectations": [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "prompt_id"}}]}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A repository-shaped directory: expectations/{tokens,prompts}.json and a tokens table."""
    (tmp_path / "expectations").mkdir()
    (tmp_path / "expectations" / "tokens.json").write_text(json.dumps(SUITE))
    (tmp_path / "expectations" / "prompts.json").write_text(json.dumps({**SUITE, "name": "prompts"}))
    pq.write_table(pa.table({"prompt_id": ["a", "b"]}), tmp_path / "tokens.parquet")
    monkeypatch.chdir(tmp_path)   # as under `dvc repro`, which runs from the repository root
    return tmp_path


def test_a_suite_name_runs_expectations_name_json(workdir):
    assert validate.main(["tokens", "tokens.parquet", "--result", "r.json", "--no-docs"]) == 0

    result = json.loads((workdir / "r.json").read_text())
    assert result["suite_file"] == "expectations/tokens.json" and result["success"] is True


def test_an_unknown_suite_name_exits_2_listing_the_available_suites(workdir, capsys):
    assert validate.main(["tokns", "tokens.parquet", "--result", "r.json", "--no-docs"]) == 2

    err = capsys.readouterr().err
    assert "suite 'tokns': neither a file nor a suite name in expectations/; available suites: prompts, tokens" in err
    assert "available suites: prompts, tokens" in json.loads((workdir / "r.json").read_text())["error"]


def test_a_missing_suite_path_exits_2_naming_it_and_the_suites_dir_given(workdir, capsys):
    (workdir / "elsewhere").mkdir()
    assert validate.main(["nope/tokens.json", "tokens.parquet", "--suites", "elsewhere", "--no-docs"]) == 2

    assert "suite 'nope/tokens.json': neither a file nor a suite name in elsewhere/; available suites: none" \
        in capsys.readouterr().err


def test_a_file_path_wins_over_a_name(workdir):
    (workdir / "tokens").write_text(json.dumps({**SUITE, "name": "from_file"}))
    assert load_suite(find_suite("tokens")).name == "from_file"


@pytest.mark.parametrize("name", ["contract", "prompts", "responses", "template", "tokens"])
def test_every_pipeline_suite_resolves_by_its_name(name):
    path = find_suite(name, ROOT / "expectations")
    assert path == ROOT / "expectations" / f"{name}.json" and load_suite(path).name == name


def test_a_name_that_is_not_an_identifier_is_not_looked_up(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "tokens.json").write_text(json.dumps(SUITE))   # what suites/../tokens.json would reach
    with pytest.raises(GateError, match="neither a file nor a suite name in .*suites/; available suites: none"):
        find_suite("../tokens", tmp_path / "suites")


@pytest.mark.parametrize("docs", ["/etc/passwd", "../outside.md", "docs/pipeline", 3])
def test_a_suites_docs_page_must_be_a_markdown_path_inside_the_repository(tmp_path, docs):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({**SUITE, "meta": {"docs": docs}}))
    with pytest.raises(GateError, match=r"meta\.docs .*e\.g\. \"docs/pipeline\.md\""):
        load_suite(str(path))
