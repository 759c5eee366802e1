"""Shared by the hidden-state tests: the real SmolLM2 target and real token rows.

The rows are ChatML conversations tokenised by the real SmolLM2 tokenizer and written as a
tokens.parquet with the project's schema, loss mask 1 on the assistant's completion.
"""

from __future__ import annotations

from pathlib import Path

TEXTS = [
    ("Why is the sky blue?", "Because air scatters short wavelengths of sunlight more than long ones."),
    ("Write a Python function that adds two numbers.", "def add(a, b):\n    return a + b\n"),
    ("Name three prime numbers.", "2, 3 and 5."),
    ("What is the capital of France?", "Paris is the capital of France."),
    ("Say hello.", "Hello!"),
    ("Explain recursion in one sentence.", "Recursion is when a function calls itself on a smaller "
     "piece of the problem until it reaches a case it can answer directly."),
    ("Count from one to ten.", "One, two, three, four, five, six, seven, eight, nine, ten."),
    ("What does HTTP stand for?", "HyperText Transfer Protocol."),
]


def token_rows(tok, n: int = len(TEXTS)) -> list[dict]:
    rows = []
    for k, (user, answer) in enumerate((TEXTS * (1 + n // len(TEXTS)))[:n]):
        prompt = tok.hf.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                            add_generation_prompt=True)
        p_ids = tok.hf.encode(prompt, add_special_tokens=False)
        c_ids = tok.hf.encode(answer + "<|im_end|>", add_special_tokens=False)
        rows.append({"prompt_id": f"p{k:04d}", "dataset": "chat" if k % 2 else "code", "split": "train",
                     "input_ids": p_ids + c_ids, "prompt_len": len(p_ids), "completion_ids": c_ids,
                     "loss_mask": [0] * len(p_ids) + [1] * len(c_ids), "n_completion": len(c_ids),
                     "quarantine_reason": None})
    return rows


def quarantined(row: dict, reason: str = "billing_mismatch") -> dict:
    return {**row, "prompt_id": row["prompt_id"] + "-q", "quarantine_reason": reason}


def write_params(path: Path, **hidden) -> Path:
    """params.yaml with the defaults, but `hidden` overridden (small shards, CPU, 1 thread)."""
    import yaml

    data = {"hidden": {"device": "cpu", "threads": 1, **hidden}}    # 1: the suite's (conftest.py)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def write_gate(path: Path, success: bool = True) -> Path:
    import json

    path.write_text(json.dumps({"success": success, "checks": 3, "failed": 0 if success else 1}))
    return path


def stage_args(work: Path, out: Path, params: Path) -> list[str]:
    return ["--params", str(params), "--tokens", str(work / "tokens.parquet"), "--gate", str(work / "gate.json"),
            "--out", str(out), "--metrics", str(out.parent / (out.name + "-metrics") / "hidden.json")]


def metrics_of(out: Path) -> dict:
    import json

    # The details: everything, the run's own figures (throughput, resumed shards) too (draftgate/metrics.py).
    return json.loads((out.parent / (out.name + "-metrics") / "hidden.details.json").read_text())


def write_tokens(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate.schema import tokens

    schema = tokens()
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols, schema=schema), path)
    return path
