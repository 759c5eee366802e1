"""Conversation shapes (templates/shapes.py): derived from what the prompts stage admits, held by
the covering corpus in every serving mode, and never admitted by the prompts stage uncompared."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from draftgate import prompts, schema
from draftgate.contract import check_template
from draftgate.official import official_template
from draftgate.templates import get_template
from draftgate.templates.shapes import FEATURE_NAMES, FEATURES, MODES, covering_corpus, shape_features
from test_stage_prompts import run, workdir, write_lines  # noqa: F401 (workdir: a fixture)

COVERING = covering_corpus()
# The keys a message may carry (schema.MESSAGE_KEYS) and the family that varies each.
VARIED_BY = {"role": "order", "content": "text", "name": "fields", "tool_calls": "calls",
             "reasoning_content": "reasoning", "tool_call_id": "order"}


def test_every_key_the_prompts_stage_admits_on_a_message_is_varied_by_a_shape_family():
    families = {family for _, family in FEATURES}
    for role, keys in schema.MESSAGE_KEYS.items():
        unvaried = sorted(k for k in keys if VARIED_BY.get(k) not in families)
        assert unvaried == [], f"{role}: add a shape feature for {unvaried} to templates/shapes.py"
    for role, keys in schema.MESSAGE_KEYS.items():
        if "name" in keys:
            assert f"name:{role}:text" in FEATURE_NAMES and f"name:{role}:empty" in FEATURE_NAMES


def test_the_covering_corpus_is_the_same_on_every_call_and_holds_every_feature_in_each_mode():
    assert covering_corpus() == COVERING
    assert 80 <= len(COVERING) <= 160          # 112 today: the comparison stays cheap
    for thinking in MODES:
        held = {f for p in COVERING if p.thinking == thinking for f in shape_features(p.messages, p.tools)}
        assert held == FEATURE_NAMES


def test_every_covering_conversation_is_a_prompt_the_prompts_stage_admits_as_it_is():
    for p in COVERING:
        messages, tools, dropped = prompts.normalise({"messages": p.messages, "tools": p.tools})
        assert (messages, tools, dropped) == (p.messages, p.tools, False), p.name


def test_features_name_the_turn_order_fields_and_reasoning_position_of_a_conversation():
    messages = [{"role": "assistant", "content": "4", "name": ""},
                {"role": "user", "content": "Add."},
                {"role": "assistant", "content": None, "reasoning_content": "", "tool_calls": [
                    {"id": "c0", "type": "function", "function": {"name": "add", "arguments": "{}"}},
                    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c0", "content": "1", "name": "add"}]
    assert set(shape_features(messages, None)) == {
        "first:assistant", "turn:assistant>user", "turn:user>calls", "turn:calls>tool", "last:tool",
        "name:assistant:empty", "name:tool:text", "tools:absent", "calls:several", "calls_content:none",
        "reasoning:assistant:absent:history:last", "reasoning:calls:empty:loop:after"}


def test_the_prompts_stage_keeps_only_shapes_the_contract_compared_and_rejects_the_rest(workdir, smollm2_tok):
    # The default target: chatml on SmolLM2, thinking off. Its contract says which (feature, mode)
    # it compared and which the code refuses; the real prompts stage must agree on every record.
    contract = check_template(get_template("chatml"), official_template(smollm2_tok, "smollm2"), COVERING)
    status = {(c.feature, c.thinking): c.status for c in contract.coverage}
    assert not contract.gaps() and "uncovered" not in status.values()
    off = [p for p in COVERING if not p.thinking]
    write_lines(workdir / "raw" / "shapes.jsonl",
                [{"messages": p.messages, "tools": p.tools, "thinking": False} for p in off])
    assert run(workdir) == 0
    kept = pq.read_table(workdir / "out" / "prompts.parquet").to_pylist()
    rejects = pq.read_table(workdir / "out" / "rejects.parquet").to_pylist()
    assert len(kept) + len(rejects) == len(off) and kept and rejects
    for row in kept:
        features = shape_features(json.loads(row["messages"]), json.loads(row["tools"]) if row["tools"] else None)
        assert {status[(f, False)] for f in features} == {"compared"}, features
    for row in rejects:
        assert row["reason"] == "template_unsupported"
        p = off[int(row["source"].split(":")[1]) - 1]
        assert "refused" in {status[(f, False)] for f in shape_features(p.messages, p.tools)}, p.name
