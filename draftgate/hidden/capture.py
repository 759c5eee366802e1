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


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default auxiliary layers: [1, N//2 - 1, N - 4] (SmolLM2, N=30: [1, 14, 26])."""
    if num_layers < 5:
        raise ValueError(f"a target with {num_layers} layers is too shallow for EAGLE-3's [1, N//2-1, N-4]")
    return (1, num_layers // 2 - 1, num_layers - 4)


def resolve_layers(layers: Sequence[int] | None, num_layers: int) -> tuple[int, int, int]:
    """`hidden.layers` checked against the target (null = the EAGLE-3 default)."""
    if layers is None:
        return eagle3_layers(num_layers)
    out = tuple(int(i) for i in layers)
    if len(out) != 3 or any(not 0 <= i < num_layers for i in out):
        raise ValueError(f"hidden.layers {list(out)}: need 3 decoder-layer ids in [0, {num_layers - 1}] "
                         f"(0-based; the target has {num_layers} layers); null takes [1, N//2-1, N-4]")
    return out  # type: ignore[return-value]


def layer_names(layers: Sequence[int], num_layers: int) -> dict[str, list[int]]:
    """The same three tensors in each convention (the manifest's `layers`)."""
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

    base = target.base
    blocks = base.layers
    n = len(blocks)
    param = next(base.parameters())
    dtype = out_dtype or param.dtype
    ids = input_ids.to(param.device)
    mask = attention_mask.to(param.device)
    b, t = ids.shape
    h = int(target.config.hidden_size)
    aux = torch.empty((b, t, len(layers), h), dtype=dtype, device=param.device)
    final = torch.empty((b, t, h), dtype=dtype, device=param.device)

    def store(dest: Any) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            dest.copy_(output[0] if isinstance(output, tuple) else output)
        return hook

    handles = [blocks[i].register_forward_hook(store(aux[:, :, j])) for j, i in enumerate(layers)]
    handles.append(blocks[n - 1].register_forward_hook(store(final)))
    try:
        with torch.inference_mode():
            base(input_ids=ids, attention_mask=mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
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
