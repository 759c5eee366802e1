"""Draft proposers for the verify loop (loop.Proposer): eagle3, ngram, oracle, random.

- eagle3: the trained EAGLE-3 drafter, fed the target's auxiliary features of every fed position.
- ngram: vLLM's prompt-lookup rule (ngram.py), the free baseline.
- oracle: the target drafting for itself, greedily, over its own KV cache: every draft token
  should be accepted (acceptance length k + 1 but for the last step), a check of the loop.
- random: uniform random ids, seeded: almost nothing is accepted, the other end of that check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from draftgate.evaluate import ngram
from draftgate.evaluate.loop import Session


@dataclass
class NgramProposer:
    n_min: int = 5
    n_max: int = 5
    name: str = "ngram"
    needs_aux: bool = False

    def start(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, ids: Sequence[int], aux: Any, k: int) -> list[int]:
        return ngram.propose(ids, k, self.n_min, self.n_max)


@dataclass
class RandomProposer:
    vocab_size: int
    seed: int = 0
    name: str = "random"
    needs_aux: bool = False
    _gen: Any = field(default=None, repr=False)

    def start(self, prompt: Sequence[int]) -> None:
        import torch

        # Seeded per prompt from the prompt itself: the same draft stream whatever ran before.
        self._gen = torch.Generator().manual_seed(self.seed * 1_000_003 + len(prompt) * 7919 + sum(prompt[-8:]))

    def propose(self, ids: Sequence[int], aux: Any, k: int) -> list[int]:
        import torch

        return torch.randint(0, self.vocab_size, (k,), generator=self._gen).tolist()


class OracleProposer:
    """The target itself as the drafter: k greedy one-token steps over its own cache."""

    name = "oracle"
    needs_aux = False

    def __init__(self, model: Any, device: str):
        self.model, self.device = model, device
        self._session: Session | None = None
        self._fed: list[int] = []

    def start(self, prompt: Sequence[int]) -> None:
        if self._session is not None:
            self._session.close()
        self._session = Session(self.model, self.device)
        self._fed = []

    def propose(self, ids: Sequence[int], aux: Any, k: int) -> list[int]:
        import torch

        s = self._session
        same = 0
        while same < min(len(self._fed), len(ids)) and self._fed[same] == ids[same]:
            same += 1
        same = min(same, len(ids) - 1)           # feed at least the last id for its logits
        with torch.inference_mode():
            s.rollback(same)
            logits, _ = s.forward(list(ids[same:]), last_only=True)
            draft = [int(logits[-1].argmax())]
            for _ in range(k - 1):
                logits, _ = s.forward([draft[-1]], last_only=True)
                draft.append(int(logits[-1].argmax()))
        self._fed = list(ids) + draft[:-1]
        return draft


class Eagle3Proposer:
    """The EAGLE-3 drafter (draftgate.drafter) over the target's aux features.

    `Eagle3Drafter.propose` recomputes its step-0 layer over the whole context on every call
    (~1.8 GFLOP at 150 positions, more than the target's 5-token verify). Here, with `cached`,
    the step-0 keys and values of the context positions are kept between calls (a position's
    step-0 input, the fused aux of position t with the embedding of token t+1, never changes once
    accepted) and only new positions, the last query and the draft chain are computed, with the
    drafter's own modules in the order its `chain` uses them; a test holds the drafts equal to
    `propose`'s. One object per prompt (the loop creates them per row).
    """

    name = "eagle3"
    needs_aux = True

    def __init__(self, drafter: Any, cached: bool = True):
        self.drafter = drafter
        self.cached = cached
        self._ids: list[int] = []
        self._keys = self._values = None

    def start(self, prompt: Sequence[int]) -> None:
        self._ids, self._keys, self._values = [], None, None

    def propose(self, ids: Sequence[int], aux: Any, k: int) -> list[int]:
        import torch

        with torch.inference_mode():
            if not self.cached:
                context = torch.tensor(list(ids), dtype=torch.long, device=aux.device)
                return [int(t) for t in self.drafter.propose(context, aux, k)]
            return self._cached_chain(list(ids), aux, k)

    def _cached_chain(self, ids: list[int], aux: Any, k: int) -> list[int]:
        import torch
        import torch.nn.functional as F

        d = self.drafter
        layer, attn = d.midlayer, d.midlayer.self_attn
        dev = d.fc.weight.device
        m = len(ids) - 1                                   # positions 0..m-1 pair aux[t] with ids[t+1]
        done = 0 if self._keys is None else self._keys.shape[2]
        if done and ids[:done + 1] != self._ids[:done + 1]:
            done, self._keys, self._values = 0, None, None   # not a continuation: start over
        if m < 1 or done >= m:
            context = torch.tensor(ids, dtype=torch.long, device=dev)
            return [int(t) for t in d.propose(context, aux, k)]
        hidden = d.fuse(aux[done:m].to(dev))[None]                                  # [1, new, H]
        new_ids = torch.tensor(ids[done + 1:m + 1], dtype=torch.long, device=dev)[None]
        x = layer.inputs(d.embed_tokens(new_ids), hidden)
        cos, sin = d.rotary(x, torch.arange(done, m, device=dev)[None])
        q, kk, vv = attn.project(x, cos, sin)
        keys = kk if self._keys is None else torch.cat([self._keys, kk], dim=2)
        values = vv if self._values is None else torch.cat([self._values, vv], dim=2)
        self._keys, self._values, self._ids = keys, values, ids
        o = F.scaled_dot_product_attention(q[:, :, -1:], keys, values)            # the last query sees all
        h = layer.finish(attn.out(o), hidden[:, -1:])
        out: list[int] = []
        for i in range(1, k + 1):
            token = d.to_target(d.logits(h)[0, -1].argmax())
            out.append(int(token))
            if i == k:
                break
            x = layer.inputs(d.embed_tokens(token.view(1, 1)), h)
            cos, sin = d.rotary(x, torch.tensor([[m - 1 + i]], device=dev))
            q, kk, vv = attn.project(x, cos, sin)
            keys, values = torch.cat([keys, kk], dim=2), torch.cat([values, vv], dim=2)
            h = layer.finish(attn.out(F.scaled_dot_product_attention(q, keys, values)), h)
        return out
