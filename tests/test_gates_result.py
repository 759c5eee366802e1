import json

import pytest

from draftgate.gates.result import GateNotPassed, require_passed


def test_a_passed_gate_lets_the_next_stage_run(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"success": True}))
    require_passed(path, "gate_x", "fix x")


@pytest.mark.parametrize("content, message", [
    (None, "gate result not found; run `dvc repro` (gate_x) first"),
    ("{not json", "not JSON"),
    (json.dumps({"success": False}), "gate_x did not pass (success: False); fix x"),
    (json.dumps({"success": "yes"}), "did not pass (success: 'yes')"),
    (json.dumps([True]), "did not pass (success: None)"),
])
def test_a_missing_unreadable_or_failed_gate_stops_the_next_stage_saying_why(tmp_path, content, message):
    path = tmp_path / "g.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(GateNotPassed) as e:
        require_passed(path, "gate_x", "fix x")
    assert message in str(e.value) and str(path) in str(e.value)
