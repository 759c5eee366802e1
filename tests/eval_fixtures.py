"""Shared by the eval tests: the real SmolLM2 target, real chat prompts, a random EAGLE-3 drafter."""

from __future__ import annotations

from pathlib import Path

PROMPTS = [
    "Write a Python function that returns the squares of a list of numbers.",
    "Say hello.",
    "List the days of the week, one per line.",
]


def chat_prompt(tok, text: str) -> list[int]:
    rendered = tok.hf.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                          add_generation_prompt=True)
    return tok.hf.encode(rendered, add_special_tokens=False)


def random_drafter(target, seed: int = 0, draft_vocab_size: int = 4096):
    """An untrained Eagle3Drafter on the target's aux layers; its draft vocabulary = the first ids."""
    import torch

    from draftgate.drafter.model import DrafterConfig, Eagle3Drafter
    from draftgate.target import eagle3_layers

    torch.manual_seed(seed)
    cfg = DrafterConfig.from_target(target.config, draft_vocab_size, eagle3_layers(target.num_layers))
    d = Eagle3Drafter(cfg, embed_weight=target.embed_tokens.weight.detach().float())
    t2d = torch.zeros(target.vocab_size, dtype=torch.bool)
    t2d[:draft_vocab_size] = True
    d.set_vocab(torch.zeros(draft_vocab_size, dtype=torch.int64), t2d)
    return d.eval()


def tokens_table(path: Path, tok, texts=PROMPTS, answer: str = "Sure.") -> Path:
    """A tokens.parquet of held-out rows (and one training row) with the project's columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, text in enumerate(list(texts) + ["A training prompt that must never be evaluated."]):
        p = chat_prompt(tok, text)
        c = tok.hf.encode(answer + "<|im_end|>", add_special_tokens=False)
        # Two datasets, one serving mode (ChatML has no thinking switch): the report groups by both.
        rows.append({"prompt_id": f"h{i}", "split": "heldout" if i < len(texts) else "train",
                     "dataset": f"set{i % 2}", "mode": "no_think",
                     "input_ids": p + c, "loss_mask": [0] * len(p) + [1] * len(c), "quarantine_reason": None})
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def contract(path: Path, end_id: int) -> Path:
    import json

    path.write_text(json.dumps({"roles": {"end_id": end_id}}))
    return path
