"""`make bench` fails when a bench falls below a target of its own: the verdict every bench returns."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.targets import verdict  # noqa: E402


def test_a_missed_target_fails_the_bench_and_is_named(capsys):
    assert verdict("scale", {"reconstruct": {"rss": True, "wall": False}, "resume_s": True}) == 1
    assert "scale: BELOW TARGET: reconstruct.wall (of 3 targets)" in capsys.readouterr().err


def test_every_target_met_passes():
    assert verdict("reconstruct", {"vs_per_row_loop >= 3": True, "vs_tiktoken >= 0.7": True}) == 0


def test_every_bench_whose_docstring_states_a_target_returns_its_verdict():
    # A bench that computes its targets but returns 0 regardless hides a regression from `make bench`.
    import ast
    import re

    stating = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        text = path.read_text()
        if re.search(r"\btargets?\b[^\n]*[<>]=", ast.get_docstring(ast.parse(text)) or "", re.I):
            stating.append(path.name)
            assert "verdict(" in text, path.name
    assert {"reconstruct.py", "hidden.py", "train.py", "scale.py", "client.py", "gates.py"} <= set(stating)
