"""Helpers for the hidden gate's tests: real SmolLM2 features, a draftgate.hidden/1 directory
written from given tensors (clean or deliberately corrupted, always self-consistent), and the gate
run in-process as its gate stage runs it.

The writer here is the artifact format (docs/hidden-states.md) and nothing more, so a test can
store what a buggy extractor would store; the stage's own writer refuses some of it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [("chat", "What colour is the sky on a clear day?"),
             ("code", "Write a Python function that adds two numbers."),
             ("chat", "Name three fruits.")]
COMPLETION_TOKENS = 20


@dataclass
class FeatureRow:
    prompt_id: str
    input_ids: list[int]
    loss_mask: list[int]
    aux: Any        # [T, 3, H]
    final: Any      # [T, H], before the final norm


@cache
def target():
    from draftgate.config import HiddenParams
    from draftgate.target import load_target

    return load_target(HiddenParams(device="cpu"), "cpu")


def capture_features(rows: list[dict], layers: list[int] | None = None, perturb: float = 0.0,
                     dtype: str = "bfloat16") -> list[FeatureRow]:
    """Features of `rows` (dicts with prompt_id, input_ids, loss_mask) from the real target; with
    `perturb`, from a copy whose every weight got seeded relative noise of that size."""
    import torch

    from draftgate.hidden.capture import capture_rows
    from draftgate.target import eagle3_layers

    t = target()
    if perturb:
        t = copy.deepcopy(t)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in t.model.parameters():
                p.mul_(1 + perturb * torch.randn(p.shape, generator=gen))
    layers = layers or list(eagle3_layers(t.num_layers))
    out = capture_rows(t, [torch.tensor(r["input_ids"], dtype=torch.long) for r in rows], layers,
                       getattr(torch, dtype))
    return [FeatureRow(r["prompt_id"], list(r["input_ids"]), list(r["loss_mask"]), aux, final)
            for r, (aux, final) in zip(rows, out)]


def write_hidden_dir(out: Path, rows: list[FeatureRow], tokens: Path, *, layers: list[int] | None = None,
                     tokens_sha256: str | None = None, rows_per_shard: int = 2) -> Path:
    """shard-NNNNN.safetensors (`rows_per_shard` rows each), index.parquet, manifest.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from safetensors.torch import save_file

    from draftgate.hidden.capture import layer_names
    from draftgate.target import eagle3_layers

    t = target()
    layers = layers or list(eagle3_layers(t.num_layers))
    out.mkdir(parents=True, exist_ok=True)
    shards, index = [], []
    for s in range(0, len(rows), rows_per_shard):
        part = rows[s:s + rows_per_shard]
        name = f"shard-{s // rows_per_shard:05d}.safetensors"
        offsets = [0]
        for r in part:
            offsets.append(offsets[-1] + len(r.input_ids))
        for i, r in enumerate(part):
            index.append({"prompt_id": r.prompt_id, "shard": name, "row": i, "offset": offsets[i],
                          "length": len(r.input_ids)})
        tensors = {
            "input_ids": torch.tensor([x for r in part for x in r.input_ids], dtype=torch.int64),
            "loss_mask": torch.tensor([x for r in part for x in r.loss_mask], dtype=torch.uint8),
            "row_offsets": torch.tensor(offsets, dtype=torch.int64),
            "aux": torch.cat([r.aux for r in part]).contiguous(),
            "final": torch.cat([r.final for r in part]).contiguous(),
        }
        path = out / name
        save_file(tensors, str(path), metadata={"format": "draftgate.hidden/1",
                                                "prompt_ids": json.dumps([r.prompt_id for r in part])})
        shards.append({"name": name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "rows": len(part),
                       "tokens": offsets[-1], "bytes": path.stat().st_size})
    pq.write_table(pa.Table.from_pylist(index, schema=pa.schema([
        ("prompt_id", pa.string()), ("shard", pa.string()), ("row", pa.int32()), ("offset", pa.int64()),
        ("length", pa.int64())])), out / "index.parquet")
    dtype = str(rows[0].aux.dtype).removeprefix("torch.") if rows else "bfloat16"
    manifest = {
        "format": "draftgate.hidden/1",
        "tokens_sha256": tokens_sha256 or hashlib.sha256(tokens.read_bytes()).hexdigest(),
        "model": t.identity, "tokenizer_fingerprint": t.tokenizer_fingerprint, "dtype": dtype,
        "layers": layer_names(layers, t.num_layers), "final_state": "before_norm",
        "rows": len(rows), "tokens": sum(len(r.input_ids) for r in rows), "shards": shards,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


def run_hidden_gate(hidden_dir: Path, tokens: Path, params: Path) -> dict:
    """The gate's result, as `python -m stages.gate_hidden expectations/hidden.json DIR --input tokens=...`
    makes it: the engine's run_gate with the check the stage hands it."""
    from draftgate.checks.hidden import compute
    from draftgate.gates.suite import load_suite
    from draftgate.gates.table import Input
    from draftgate.gates.validate import run_gate

    suite = load_suite(REPO / "expectations" / "hidden.json")
    run = run_gate(suite, [Input("hidden", str(hidden_dir)), Input("tokens", str(tokens))],
                   params_path=str(params), docs=None, checks={"hidden": compute})
    return run.result


def greedy_world(root: Path) -> dict:
    """Three chat prompts answered greedily by the local SmolLM2 (+1 quarantined copy) as a tokens
    table, params that say temperature 0 and resample every row, and the rows' clean features."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from draftgate.serve.model import Sampling, generate_batch, load

    lm = load("cpu")
    prompts = [lm.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False) for _, q in QUESTIONS]
    gens = generate_batch(lm, prompts, [Sampling(max_tokens=COMPLETION_TOKENS)] * len(prompts))
    records = []
    for i, ((dataset, _), prompt, gen) in enumerate(zip(QUESTIONS, prompts, gens)):
        records.append({"prompt_id": f"p{i}", "dataset": dataset, "input_ids": list(prompt) + gen.ids,
                        "loss_mask": [0] * len(prompt) + [1] * len(gen.ids), "quarantine_reason": None})
    records.append({"prompt_id": "quarantined", "dataset": "chat", "input_ids": records[0]["input_ids"],
                    "loss_mask": records[0]["loss_mask"], "quarantine_reason": "billing_mismatch"})
    tokens = root / "tokens.parquet"
    pq.write_table(pa.Table.from_pylist(records, schema=pa.schema([
        ("prompt_id", pa.string()), ("dataset", pa.string()), ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())), ("quarantine_reason", pa.string())])), tokens)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["generate"]["temperature"] = 0.0          # the rows above are greedy
    params.setdefault("gates", {})["hidden"] = {"resample_rows": 3, "resample_seed": 0}
    params_path = root / "params.yaml"
    params_path.write_text(yaml.safe_dump(params))
    kept = [r for r in records if r["quarantine_reason"] is None]
    features = capture_features(kept)
    clean = write_hidden_dir(root / "clean", features, tokens)
    return {"root": root, "tokens": tokens, "params": params_path, "kept": kept, "features": features,
            "clean": clean}
