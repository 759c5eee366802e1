"""gate_template recounts shape coverage from the conversations in contract.json, never from the label
the contract stage wrote (draftgate/checks/template.py): its record lists every (feature, mode) it
recounted, a feature whose conversations are gone fails it by name, and relabelling the probes'
`features` changes nothing. The contract here is Qwen3's official-like template
(tests/near_miss_fixtures.py), which compares every feature in both modes, on the fixed probes and
the covering corpus (~140 conversations, ~0.1 s to render); each gate run is ~0.5 s after GX's import.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from draftgate.checks.template import features_of
from draftgate.contract import check_template
from draftgate.gates import page
from draftgate.templates import get_template
from draftgate.templates.corpus import generated_corpus
from draftgate.templates.probes import PROBES
from draftgate.templates.shapes import FEATURE_NAMES, FEATURES, MODES, covering_corpus, shape_features
from near_miss_fixtures import QWEN3_LIKE, official_like
from stages import gate_template
from test_official import SUITE

FEATURE = "name:user:empty"     # one the covering corpus holds in a conversation of its own


@pytest.fixture(scope="module")
def honest(qwen3_tok, kimi_standin_tok) -> dict:
    """contract.json's template part for qwen3 against its official-like template: every probe equal."""
    official = official_like("qwen3", QWEN3_LIKE, qwen3_tok, kimi_standin_tok)
    result = check_template(get_template("qwen3"), official, PROBES + covering_corpus())
    assert result.ok and result.complete
    return json.loads(json.dumps(result.document()))


def run_gate(tmp_path: Path, doc: dict, name: str = "gate") -> tuple[int, dict]:
    """gate_template on `doc` as contract.json, in its own folder: (exit code, the record)."""
    d = tmp_path / name
    d.mkdir()
    (d / "contract.json").write_text(json.dumps(doc))
    (d / "params.yaml").write_text(yaml.safe_dump({"gates": {"template": {"min_compared": 1}}}))
    code = gate_template.main([str(SUITE), str(d / "contract.json"), "--result", str(d / "r.json"),
                               "--params", str(d / "params.yaml"), "--no-docs"])
    return code, json.loads((d / "r.json").read_text())


def holds(p: dict, feature: str, thinking: bool) -> bool:
    tools = None if p["tools"] is None else json.loads(p["tools"])
    return p["thinking"] == thinking and feature in features_of(json.loads(p["messages"]), tools)


def without(doc: dict, feature: str, thinking: bool) -> dict:
    """`doc` with every probe of that mode whose conversation holds `feature` deleted."""
    out = copy.deepcopy(doc)
    out["template_probes"] = [p for p in out["template_probes"] if not holds(p, feature, thinking)]
    assert len(out["template_probes"]) < len(doc["template_probes"])
    return out


def coverage_rows(record: dict) -> list[dict]:
    return record["computed"]["report"]["tables"]["shape_coverage"]["rows"]


def failed(record: dict) -> dict[str, list]:
    return {e["kwargs"]["column"]: e["unexpected_sample"] for e in record["expectations"] if not e["success"]}


def test_the_gates_reading_of_a_conversation_agrees_with_the_catalogues_on_every_probe_and_corpus():
    for p in PROBES + generated_corpus(0, 300) + covering_corpus():
        assert features_of(p.messages, p.tools) & FEATURE_NAMES == set(shape_features(p.messages, p.tools)), p.name


def test_the_honest_contract_passes_and_the_record_lists_every_feature_covered_in_each_mode(tmp_path, honest):
    code, record = run_gate(tmp_path, honest)
    assert code == 0 and record["success"]
    rows = coverage_rows(record)
    assert [(r["feature"], r["family"], r["thinking"]) for r in rows] == [
        (f, family, thinking) for thinking in MODES for f, family in FEATURES]
    assert {r["status"] for r in rows} == {"covered"}
    probes = {p["probe"] for p in honest["template_probes"]}
    assert all(r["equal"] >= 1 and r["covered_by"] in probes for r in rows)
    assert record["computed"]["report"]["shape_features"]["covered"] == 2 * len(FEATURES)


def test_the_gates_page_shows_the_recounted_table_with_a_row_per_feature_and_mode(tmp_path, honest):
    _, record = run_gate(tmp_path, honest)
    text = page.render(record, record="data/gates/template.details.json")
    assert f"Computed by the gate: shape_coverage, {2 * len(FEATURES)} rows" in text
    assert "computed.report.tables.shape_coverage" in text
    assert text.count("<tr>") >= 2 * len(FEATURES) and f'<td class="mono">{FEATURE}</td>' in text


def test_deleting_the_conversations_that_hold_a_feature_fails_the_gate_naming_that_feature(tmp_path, honest):
    code, record = run_gate(tmp_path, without(honest, FEATURE, thinking=True))
    assert code == 1 and failed(record) == {"never_held": [f"{FEATURE} (thinking on)"]}
    [row] = [r for r in coverage_rows(record) if r["status"] != "covered"]
    assert (row["feature"], row["thinking"], row["held"], row["status"]) == (FEATURE, True, 0, "never_held")


def test_relabelling_the_probes_features_changes_nothing_in_the_gates_verdict(tmp_path, honest):
    _, before = run_gate(tmp_path, honest, "honest")
    # Every label emptied (and the stage's own count dropped): the honest contract still passes, alike.
    blank = copy.deepcopy(honest)
    for p in blank["template_probes"]:
        p["features"] = []
    blank.pop("template_coverage")
    code, after = run_gate(tmp_path, blank, "blank")
    assert code == 0 and after["computed"] == before["computed"]
    assert [e["success"] for e in after["expectations"]] == [e["success"] for e in before["expectations"]]
    # A gap labelled away: every remaining probe claims the missing feature; the gate still names it.
    doc = without(honest, FEATURE, thinking=True)
    for p in doc["template_probes"]:
        p["features"] = sorted(FEATURE_NAMES)
    code, record = run_gate(tmp_path, doc, "claimed")
    assert code == 1 and failed(record) == {"never_held": [f"{FEATURE} (thinking on)"]}


def test_a_contract_written_before_conversations_were_stored_has_no_verdict_and_says_to_rerun_it(
        tmp_path, honest, capsys):
    doc = copy.deepcopy(honest)
    for p in doc["template_probes"]:
        del p["messages"], p["tools"]
    code, record = run_gate(tmp_path, doc)
    assert code == 2 and not record["success"]
    assert ("template_probes[0] ('" + honest["template_probes"][0]["probe"] + "') has no stored conversation") \
        in record["error"]
    assert "rerun it (dvc repro contract)" in capsys.readouterr().err
