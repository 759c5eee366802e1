"""Speculative decoding with the target, greedy, and plain greedy decoding (docs/evaluation.md).

One sequence at a time over one KV cache (`Session`). Each speculative step feeds the target the
pending token (emitted last step, not yet in the cache) and the proposer's draft d1..dm in ONE
forward; the target's argmax after each prefix decides: the longest prefix of the draft equal to
the target's own choices is accepted, then the target's choice after it is emitted as the bonus
(correction) token. The cache holds K/V for every fed position, so after a rejection it is cut
back to the pending token plus the accepted drafts. The output is therefore the target's own
greedy output; where a verify forward over m+1 positions rounds a near-tie differently from a
one-token step, the two may part, which the eval gate measures (gates/eval.py).

The target's auxiliary features (decoder-layer outputs, the layers the drafter was trained on)
are captured by forward hooks in the same verify forward, and kept for accepted positions only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence


class Proposer(Protocol):
    name: str
    needs_aux: bool

    def start(self, prompt: Sequence[int]) -> None:
        """A new prompt begins (drop per-sequence state)."""

    def propose(self, ids: Sequence[int], aux: Any, k: int) -> list[int]:
        """Up to k draft tokens continuing `ids` (prompt + emitted; the last one is not yet fed).

        `aux` (when needs_aux): the target's features [len(ids) - 1, n_layers, H] for every fed
        position, i.e. every id but the last.
        """


@dataclass
class Decoded:
    ids: list[int]                      # emitted tokens, the end token included when it stopped
    finish: str                         # "stop" (end token) or "length" (max_new_tokens)
    drafted: list[int] = field(default_factory=list)   # per verify step
    accepted: list[int] = field(default_factory=list)
    emitted: list[int] = field(default_factory=list)   # accepted + 1, cut at the stop
    seconds: float = 0.0


def decoder_layers(model: Any) -> Any:
    """The decoder layers of an HF causal LM (Llama-style: model.model.layers)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no .model.layers; eval supports Llama-style HF causal LMs")
    return layers


def attach_aux_hooks(model: Any, aux_layers: Sequence[int], hook: Callable[[int], Callable]) -> list:
    """A forward hook on each aux decoder layer (the verify forward captures the drafter's features)."""
    layers = decoder_layers(model)
    for i in aux_layers:
        if not 0 <= i < len(layers):
            raise ValueError(f"aux layer {i} outside the target's {len(layers)} decoder layers")
    return [layers[i].register_forward_hook(hook(i)) for i in aux_layers]


class Session:
    """One sequence on the target: its KV cache, and forwards that return logits (and aux)."""

    def __init__(self, model: Any, device: str, aux_layers: Sequence[int] | None = None):
        from transformers.cache_utils import DynamicCache

        self.model, self.device = model, device
        self.cache = DynamicCache(config=model.config)
        self.length = 0
        self._captured: dict[int, Any] = {}
        self.aux_layers = tuple(aux_layers or ())
        self._hooks = attach_aux_hooks(model, self.aux_layers, self._hook)

    def _hook(self, i: int) -> Callable:
        def keep(_module, _inputs, output):
            # Llama decoder layers return the hidden state (older transformers: a tuple).
            self._captured[i] = output[0] if isinstance(output, tuple) else output
        return keep

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def forward(self, ids: Sequence[int], last_only: bool = False) -> tuple[Any, Any]:
        """Feed `ids` after the cached positions: (float32 logits [n or 1, V], aux [n, L, H] or None)."""
        import torch

        n = len(ids)
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        pos = torch.arange(self.length, self.length + n, device=self.device)[None]
        self._captured.clear()
        out = self.model(input_ids=x, position_ids=pos, cache=self.cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0)
        self.length += n
        aux = None
        if self.aux_layers:
            aux = torch.stack([self._captured[i][0] for i in self.aux_layers], dim=1).float()
        return out.logits[0].float(), aux

    def rollback(self, length: int) -> None:
        """Forget every cached position from `length` on (rejected drafts)."""
        remove = self.length - length
        if remove < 0:
            raise ValueError(f"cannot roll forward: cache holds {self.length}, asked for {length}")
        if remove:
            self.cache.crop(-remove)     # transformers 5: a negative count removes that many
        if self.cache.get_seq_length() != length:
            raise RuntimeError(f"KV cache rollback left {self.cache.get_seq_length()} positions, wanted {length}")
        self.length = length


def _stop_cut(tokens: list[int], room: int, end_ids: frozenset[int]) -> tuple[list[int], bool]:
    """Tokens kept of `tokens` given `room` left before max_new_tokens; whether an end token stopped it."""
    kept = []
    for t in tokens[:room]:
        kept.append(t)
        if t in end_ids:
            return kept, True
    return kept, False


def speculative_decode(model: Any, device: str, prompt: Sequence[int], proposer: Proposer, k: int,
                       max_new_tokens: int, end_ids: frozenset[int],
                       aux_layers: Sequence[int] | None = None) -> Decoded:
    """Greedy speculative decoding of one prompt; see the module docstring."""
    import torch

    if not prompt:
        raise ValueError("empty prompt")
    started = time.perf_counter()
    proposer.start(prompt)
    with torch.inference_mode(), Session(model, device, aux_layers if proposer.needs_aux else None) as s:
        logits, aux = s.forward(prompt, last_only=True)   # the hooks still see every position
        feats = [aux] if aux is not None else []
        out = [int(logits[-1].argmax())]          # the prefill's token: not a verify step
        result = Decoded(ids=out, finish="stop" if out[0] in end_ids else "length")
        while out[-1] not in end_ids and len(out) < max_new_tokens:
            ids = list(prompt) + out
            context = torch.cat(feats) if feats else None
            draft = [int(t) for t in proposer.propose(ids, context, k)][:k]
            base = s.length                         # = len(ids) - 1: the pending token is not fed
            logits, aux = s.forward([out[-1]] + draft)
            choice = logits.argmax(-1).tolist()     # choice[j]: the target's token after d1..dj
            accepted = 0
            while accepted < len(draft) and draft[accepted] == choice[accepted]:
                accepted += 1
            new = draft[:accepted] + [choice[accepted]]
            s.rollback(base + 1 + accepted)         # pending + accepted drafts stay cached
            if aux is not None:
                feats.append(aux[:1 + accepted])
            kept, stopped = _stop_cut(new, max_new_tokens - len(out), end_ids)
            out.extend(kept)
            result.drafted.append(len(draft))
            result.accepted.append(accepted)
            result.emitted.append(len(kept))
            if stopped:
                break
        result.finish = "stop" if out[-1] in end_ids else "length"
    result.seconds = time.perf_counter() - started
    return result


@dataclass
class Greedy:
    ids: list[int]
    finish: str
    top2: list[tuple[int, float, int, float]]   # per emitted token: (top id, logit, second id, logit)
    seconds: float = 0.0


def greedy_decode(model: Any, device: str, prompt: Sequence[int], max_new_tokens: int,
                  end_ids: frozenset[int]) -> Greedy:
    """Plain greedy decoding, one token per forward over a KV cache; the top two logits of each step."""
    import torch

    started = time.perf_counter()
    out: list[int] = []
    top2: list[tuple[int, float, int, float]] = []
    with torch.inference_mode(), Session(model, device) as s:
        logits, _ = s.forward(prompt, last_only=True)
        while True:
            values, ids = logits[-1].topk(2)
            top2.append((int(ids[0]), float(values[0]), int(ids[1]), float(values[1])))
            out.append(int(ids[0]))
            if out[-1] in end_ids or len(out) >= max_new_tokens:
                break
            logits, _ = s.forward([out[-1]], last_only=True)
    return Greedy(out, "stop" if out[-1] in end_ids else "length", top2, time.perf_counter() - started)


def teacher_forced_logits(model: Any, device: str, prompt: Sequence[int], output: Sequence[int]) -> Any:
    """The target's float32 logits predicting each output token, given prompt + output before it."""
    import torch

    with torch.inference_mode(), Session(model, device) as s:
        logits, _ = s.forward(list(prompt) + list(output)[:-1])
    return logits[len(prompt) - 1:]


# ---------------------------------------------------------------- batched: many prompts per forward

class BatchSession:
    """Rows decoded together over one KV cache; a 2-D mask says which cached slots each row sees.

    Prompts are left-padded; each verify step appends the same number of slots to every row
    (pending token, its drafts, padding), and the slots of rejected or padded drafts are masked
    out instead of cut (rows accept different counts). Positions (RoPE) are per row and count
    only the slots a row sees, so each row computes what it would alone; the logits differ from
    a one-row run in the last bits only (docs/evaluation.md).
    """

    def __init__(self, model: Any, device: str, aux_layers: Sequence[int] | None = None):
        from transformers.cache_utils import DynamicCache

        self.model, self.device = model, device
        self.cache = DynamicCache(config=model.config)
        self.mask = None                      # LongTensor [B, slots]
        self._captured: dict[int, Any] = {}
        self.aux_layers = tuple(aux_layers or ())
        self._hooks = attach_aux_hooks(model, self.aux_layers, self._hook)

    _hook = Session._hook
    close = Session.close
    __enter__ = Session.__enter__
    __exit__ = Session.__exit__

    def forward(self, ids: Any, valid: Any, positions: Any, last_only: bool = False) -> tuple[Any, Any]:
        """ids/valid/positions [B, M]: (float32 logits [B, M or 1, V], aux [B, M, L, H] or None)."""
        import torch

        self.mask = valid.long() if self.mask is None else torch.cat([self.mask, valid.long()], dim=1)
        self._captured.clear()
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=positions, cache=self.cache,
                         use_cache=True, logits_to_keep=1 if last_only else 0)
        aux = None
        if self.aux_layers:
            aux = torch.stack([self._captured[i] for i in self.aux_layers], dim=2).float()
        return out.logits.float(), aux

    def hide(self, row: int, start: int) -> None:
        """Mask the slots of `row` from `start` on (rejected drafts stay cached but unseen)."""
        self.mask[row, start:] = 0

    def keep_rows(self, index: list[int]) -> None:
        import torch

        sel = torch.tensor(index, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(sel)
        self.mask = self.mask[sel]


def _prefill(s: BatchSession, prompts: Sequence[Sequence[int]]) -> tuple[Any, Any, list[int]]:
    """Left-padded prompts in one forward: (last logits [B, V], aux [B, W, L, H] or None, pad per row)."""
    import torch

    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    # Padding slots are masked out; they repeat the row's first id (no token id literal needed).
    ids = torch.tensor([[p[0]] * pad + list(p) for p, pad in zip(prompts, pads)], dtype=torch.long, device=s.device)
    valid = torch.arange(width, device=s.device)[None, :] >= torch.tensor(pads, device=s.device)[:, None]
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    logits, aux = s.forward(ids, valid, positions, last_only=True)
    return logits[:, -1], aux, pads


def speculative_decode_batch(model: Any, device: str, prompts: Sequence[Sequence[int]],
                             proposers: Sequence[Proposer], k: int, max_new_tokens: int,
                             end_ids: frozenset[int], aux_layers: Sequence[int] | None = None) -> list[Decoded]:
    """`speculative_decode` for many prompts at once (one proposer object per prompt)."""
    import torch

    if not prompts or len(prompts) != len(proposers) or any(not p for p in prompts):
        raise ValueError("need one proposer per prompt and no empty prompt")
    started = time.perf_counter()
    for prompt, proposer in zip(prompts, proposers):
        proposer.start(prompt)
    needs_aux = any(p.needs_aux for p in proposers)
    results: list[Decoded] = []
    with torch.inference_mode(), BatchSession(model, device, aux_layers if needs_aux else None) as s:
        logits, aux, pads = _prefill(s, prompts)
        first = logits.argmax(-1).tolist()
        results = [Decoded(ids=[t], finish="length") for t in first]
        feats = [[aux[r, pads[r]:]] if aux is not None else [] for r in range(len(prompts))]
        live = [r for r in range(len(prompts)) if first[r] not in end_ids and max_new_tokens > 1]
        if len(live) < len(prompts):
            s.keep_rows(live) if live else None
        while live:
            drafts = []
            for r in live:
                ids = list(prompts[r]) + results[r].ids
                context = torch.cat(feats[r]) if feats[r] else None
                drafts.append([int(t) for t in proposers[r].propose(ids, context, k)][:k])
            width = 1 + max(len(d) for d in drafts)
            base = s.mask.shape[1]
            seen = s.mask.sum(-1)                        # slots each row sees = its next position
            rows = [[results[r].ids[-1]] + d + [results[r].ids[-1]] * (width - 1 - len(d))
                    for r, d in zip(live, drafts)]
            ids = torch.tensor(rows, dtype=torch.long, device=device)
            valid = torch.arange(width, device=device)[None, :] <= torch.tensor(
                [len(d) for d in drafts], device=device)[:, None]
            positions = seen[:, None] + torch.arange(width, device=device)[None, :]
            logits, aux = s.forward(ids, valid, positions)
            choice = logits.argmax(-1).tolist()        # choice[i][j]: row i's token after d1..dj
            keep = []
            for i, r in enumerate(live):
                draft, res = drafts[i], results[r]
                accepted = 0
                while accepted < len(draft) and draft[accepted] == choice[i][accepted]:
                    accepted += 1
                s.hide(i, base + 1 + accepted)           # pending + accepted drafts stay visible
                if aux is not None:
                    feats[r].append(aux[i, :1 + accepted])
                kept, stopped = _stop_cut(draft[:accepted] + [choice[i][accepted]],
                                          max_new_tokens - len(res.ids), end_ids)
                res.ids.extend(kept)
                res.drafted.append(len(draft))
                res.accepted.append(accepted)
                res.emitted.append(len(kept))
                if not stopped and len(res.ids) < max_new_tokens:
                    keep.append(i)
            if len(keep) < len(live):
                if keep:
                    s.keep_rows(keep)
                live = [live[i] for i in keep]
    for res in results:
        res.finish = "stop" if res.ids[-1] in end_ids else "length"
        res.seconds = time.perf_counter() - started
    return results


def greedy_decode_batch(model: Any, device: str, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                        end_ids: frozenset[int]) -> list[Greedy]:
    """`greedy_decode` for many prompts at once: one token per row per forward."""
    import torch

    started = time.perf_counter()
    outs: list[list[int]] = [[] for _ in prompts]
    top2: list[list[tuple[int, float, int, float]]] = [[] for _ in prompts]
    with torch.inference_mode(), BatchSession(model, device) as s:
        logits, _, _ = _prefill(s, prompts)
        live = list(range(len(prompts)))
        while True:
            values, ids = logits.topk(2, dim=-1)
            keep = []
            for i, r in enumerate(live):
                top2[r].append((int(ids[i, 0]), float(values[i, 0]), int(ids[i, 1]), float(values[i, 1])))
                outs[r].append(int(ids[i, 0]))
                if outs[r][-1] not in end_ids and len(outs[r]) < max_new_tokens:
                    keep.append(i)
            if not keep:
                break
            if len(keep) < len(live):
                s.keep_rows(keep)
                live = [live[i] for i in keep]
            seen = s.mask.sum(-1)
            nxt = torch.tensor([[outs[r][-1]] for r in live], dtype=torch.long, device=device)
            logits, _ = s.forward(nxt, torch.ones_like(nxt, dtype=torch.bool), seen[:, None], last_only=True)
            logits = logits[:, -1]
    seconds = time.perf_counter() - started
    return [Greedy(o, "stop" if o[-1] in end_ids else "length", t, seconds) for o, t in zip(outs, top2)]
