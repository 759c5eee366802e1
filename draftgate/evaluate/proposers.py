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
    (~1.8 GFLOP at 150 positions, more than the target's 5-token verify). With `cached`, the
    drafter keeps the step-0 keys and values of the context positions between calls
    (model.StepZeroCache) and computes only new positions, the last query and the draft chain;
    a test holds the drafts equal to the uncached ones. One object per prompt (the loop creates
    them per row).
    """

    name = "eagle3"
    needs_aux = True

    def __init__(self, drafter: Any, cached: bool = True):
        from draftgate.drafter.model import StepZeroCache

        self.drafter = drafter
        self.cached = cached
        self.cache = StepZeroCache()

    def start(self, prompt: Sequence[int]) -> None:
        self.cache.reset()

    def propose(self, ids: Sequence[int], aux: Any, k: int) -> list[int]:
        import torch

        with torch.inference_mode():
            context = torch.tensor(list(ids), dtype=torch.long)
            return self.drafter.chain(context, aux, k, cache=self.cache if self.cached else None)[0]
