"""Capture EAGLE-3 features: three auxiliary decoder-layer outputs and the final state before the norm.

One forward pass of the decoder stack (no LM head: the full-vocabulary logits are never computed
during extraction), with forward hooks on the decoder layers that copy their outputs into
preallocated tensors. Layer ids are 0-based decoder-layer outputs; docs/hidden-states.md lists the
other tools' names for the same tensors (HF `hidden_states[i+1]`, SGLang/vLLM `i+1`).

Rows are right-padded with an attention mask, so every real position sees exactly the positions
it would see alone (same position ids, causal attention); the padded tail is cut off by the caller.
"""

from __future__ import annotations

from typing import Any, Sequence


def layer_names(layers: Sequence[int], num_layers: int) -> dict[str, list[int]]:
    """The same three tensors in each convention (the manifest's `layers`)."""
    from draftgate.target import resolve_layers

    ids = list(resolve_layers(layers, num_layers))
    return {
        "eagle3": ids,                              # 0-based decoder-layer outputs (SpecForge, ModelOpt)
        "hf_hidden_states": [i + 1 for i in ids],   # index into HF output_hidden_states (0 = embeddings)
        "sglang_vllm": [i + 1 for i in ids],        # captured at the input of the next layer
    }


def capture(target: Any, input_ids: Any, attention_mask: Any, layers: Sequence[int],
            out_dtype: Any = None) -> tuple[Any, Any]:
    """aux [B, T, 3, H] and final [B, T, H] (the last decoder layer's output, before the norm).

    `out_dtype` (default: the model's) is what the hooks store, so a bfloat16 artifact never holds
    a float32 copy of the batch. Padded positions hold whatever the layers computed there.
    """
    import torch

    from draftgate.target import capturing

    base = target.base
    param = next(base.parameters())
    ids = input_ids.to(param.device)
    mask = attention_mask.to(param.device)
    b, t = ids.shape
    with capturing(base, layers, b, t, out_dtype or param.dtype) as (aux, final), torch.inference_mode():
        base(input_ids=ids, attention_mask=mask, use_cache=False)
    return aux, final


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Row indices grouped for forward passes: sorted by length (longest first, ties by index),
    each batch at most `batch_tokens` padded tokens (rows x its longest row); a row longer than
    the budget goes alone. Sorting keeps the padding small; `padding_fraction` measures it."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * width > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def padding_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    return 1.0 - sum(lengths) / padded if padded else 0.0


def capture_rows(target: Any, rows: Sequence[Any], layers: Sequence[int], out_dtype: Any = None) -> list[tuple[Any, Any]]:
    """Capture a list of 1-D id tensors in one right-padded batch; each result is cut to its row's
    true length and moved to the CPU: [(aux [T_i, 3, H], final [T_i, H]), ...]."""
    import torch

    width = max(int(r.numel()) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, :r.numel()] = r
        mask[k, :r.numel()] = 1
    aux, final = capture(target, ids, mask, layers, out_dtype)
    out = []
    for k, r in enumerate(rows):
        n = int(r.numel())
        out.append((aux[k, :n].cpu(), final[k, :n].cpu()))
    return out
