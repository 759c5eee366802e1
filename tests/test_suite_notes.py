"""Every check of every suite explains itself on the Data Docs: its meta.notes (GX renders them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from draftgate.gates import gx as gx_run
from draftgate.gates.suite import ExpectationSpec

SUITES = sorted((Path(__file__).resolve().parents[1] / "expectations").glob("*.json"))


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_every_expectation_carries_a_note_that_names_the_param_behind_its_threshold(path):
    doc = json.loads(path.read_text(encoding="utf-8"))
    section = doc.get("params_section") or doc["name"]
    missing, unnamed = [], []
    for i, e in enumerate(doc["expectations"]):
        where = f"{path.name}: expectations[{i}] {e['type']}({e['kwargs'].get('column', '')})"
        note = e.get("meta", {}).get("notes")
        if not isinstance(note, str) or len(note.split()) < 5:
            missing.append(where)
            continue
        for value in e["kwargs"].values():
            if isinstance(value, dict) and "$PARAMETER" in value:
                if f"gates.{section}.{value['$PARAMETER']}" not in note:
                    unnamed.append(f"{where}: name gates.{section}.{value['$PARAMETER']}")
    assert missing == [], ("add meta.notes (what it recomputes, from which columns or inputs, why a failure "
                           "matters, the param behind its threshold) to: " + "; ".join(missing))
    assert unnamed == []


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_no_suite_points_at_a_module_that_moved(path):
    # The domain checks moved from draftgate/gates/ to draftgate/checks/.
    stale = re.findall(r"draftgate/gates/(?:hidden|eval|drafter)\.py", path.read_text(encoding="utf-8"))
    assert stale == [], f"{path.name}: say draftgate/checks/ instead of {stale}"


def test_a_note_reaches_gx_as_the_expectations_own_notes_rendered_as_plain_markdown():
    spec = ExpectationSpec("expect_column_values_to_not_be_null", {"column": "prompt_id"},
                           {"notes": "joins on `prompt_id`", "why": "kept as meta"})
    expectation = gx_run.build_expectation(spec)
    assert expectation.notes == ["joins on `prompt_id`"]       # a list: GX draws a bare string in red
    assert expectation.meta == {"notes": "joins on `prompt_id`", "why": "kept as meta"}
