"""Held-out contamination: the same question on both sides of the split is found, reported with
examples, fails the prompts gate, and lands on one side under prompts.split_by: last_user."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest

from draftgate.config import PromptsParams
from draftgate.prompts import RawRecord
from draftgate.prompts.contamination import contamination, last_user, normalised
from prompts_fixtures import ingest


def _question(k: int) -> str:
    # Distinct questions, not one template with a number in it (those ARE near duplicates).
    rng = random.Random(k)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9))) for _ in range(10)]
    return "Why does " + " ".join(words) + "?"


QUESTIONS = [_question(k) for k in range(40)]


def row(pid, split, *messages):
    return {"prompt_id": pid, "split": split, "messages": json.dumps(list(messages))}


def user(text):
    return {"role": "user", "content": text}


def test_the_same_question_under_another_system_prompt_case_and_spacing_is_exact_contamination():
    q = "What is the capital of France?"
    rows = [row("t1", "train", {"role": "system", "content": "Be brief."}, user(q)),
            row("h1", "heldout", user("  what is the CAPITAL of\tFrance?\n")),
            row("h2", "heldout", user("Name a prime number between 10 and 20."))]
    c = contamination(rows, 0.8)
    assert normalised("  Ça\u00a0VA ?\n") == "ça va ?" and last_user(json.loads(rows[1]["messages"])) == normalised(q)
    assert (c.heldout, c.exact, c.contaminated) == (2, 1, 1)
    assert c.examples == [{"heldout": "h1", "train": "t1", "kind": "exact_last_user"}]
    assert c.to_dict(0.8)["rate"] == 0.5


def test_a_lightly_edited_conversation_is_a_near_duplicate_by_minhash():
    long = ("Write a Python function that parses an ISO 8601 date string, validates the month and the day, "
            "and returns a datetime.date; raise ValueError with a helpful message otherwise.")
    rows = [row("t1", "train", user(long)),
            row("h1", "heldout", user(long.replace("helpful", "clear"))),
            row("h2", "heldout", user("Tell me a joke about cats."))]
    c = contamination(rows, 0.8)
    assert (c.exact, c.near, c.contaminated) == (0, 1, 1)
    assert c.examples == [{"heldout": "h1", "train": "t1", "kind": "near_duplicate"}]


def records(split_by):
    # Each question twice: once bare, once under a system prompt with other spacing (two prompt ids).
    recs = []
    for k, q in enumerate(QUESTIONS):
        recs.append(RawRecord("chat.jsonl", 2 * k + 1, json.dumps({"messages": [user(q)]}).encode()))
        recs.append(RawRecord("chat.jsonl", 2 * k + 2, json.dumps({"messages": [
            {"role": "system", "content": "You are terse."}, user(q.upper() + "  ")]}).encode()))
    return recs


@pytest.mark.parametrize("split_by, leaks", [("prompt", True), ("last_user", False)])
def test_split_by_last_user_puts_both_copies_of_a_question_on_one_side(split_by, leaks):
    params = PromptsParams(heldout_fraction=0.5, split_seed=0, split_by=split_by)
    rows = ingest(records(split_by), params).rows
    assert len(rows) == 80
    sides = {}
    for r in rows:
        sides.setdefault(last_user(json.loads(r["messages"])), set()).add(r["split"])
    split_pairs = sum(len(s) == 2 for s in sides.values())
    assert (split_pairs > 0) == leaks
    assert (contamination(rows, 0.8).contaminated > 0) == leaks


def test_the_prompts_gate_fails_a_split_with_the_same_question_on_both_sides(tmp_path):
    import pyarrow.parquet as pq
    import yaml

    from draftgate.config import parse_params
    from draftgate.gates import validate as gates
    from draftgate.prompts.run import PromptsRequest, run

    suite = Path(__file__).resolve().parents[1] / "expectations" / "prompts.json"
    results = {}
    for split_by in ("prompt", "last_user"):
        raw, out = tmp_path / split_by / "raw", tmp_path / split_by / "out"
        raw.mkdir(parents=True)
        (raw / "chat.jsonl").write_bytes(b"".join(r.data + b"\n" for r in records(split_by)))
        doc = {"prompts": {"heldout_fraction": 0.2, "split_by": split_by}, "template": {"name": "qwen3"},
               "tokenizer": {"kind": "qwen3"}, "gates": {"prompts": {"max_contamination_rate": 0.0}}}
        (tmp_path / split_by / "params.yaml").write_text(yaml.safe_dump(doc))
        done = run(parse_params(doc), PromptsRequest(raw, out))
        code = gates.main([str(suite), str(out / "prompts.parquet"), "--input", f"rejects={out / 'rejects.parquet'}",
                           "--params", str(tmp_path / split_by / "params.yaml"), "--no-docs",
                           "--result", str(tmp_path / split_by / "r.json")])
        r = json.loads((tmp_path / split_by / "r.json").read_text())
        failed = {e["kwargs"].get("column") for e in r["expectations"] if not e["success"]}
        results[split_by] = (code, failed, done.metrics.figures["contamination"]["rate"],
                             pq.read_table(out / "prompts.parquet").num_rows)
    code, failed, rate, n = results["prompt"]
    assert code == 1 and failed == {"contamination_rate"} and rate > 0 and n == 80
    code, failed, rate, n = results["last_user"]
    assert (code, failed, rate, n) == (0, set(), 0.0, 80)
