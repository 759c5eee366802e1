"""Degenerate completions: how much of a completion repeats itself, measured on its ids.

Sampled models loop ("I am a bot. I am a bot. ..."), and a drafter trained on loops predicts
loops. The measure is seq-rep-n (Welleck et al. 2019, "Neural text generation with unlikelihood
training"): the share of a completion's n-grams that repeat an earlier n-gram of the same
completion, 1 - distinct / total, on token ids. A completion that is one loop from its start
scores 1 - period / (length - n + 1); a loop over its second half about 0.5; ordinary text near 0.
n = 4 (the paper's): short enough for a loop of one short sentence, long enough that repeated
names or markup (a few tokens) do not count.

Measured on the demo (`dvc repro` of the default: SmolLM2-135M, 118 rows at 128 tokens):
p50 0.029, p90 0.184, max 0.616; 4 rows above 0.3, none above 0.7. The default threshold
(reconstruct.max_repetition: 0.7, a loop over most of the completion) quarantines none of them.
The tokens gate recomputes the same figure from the ids in SQL (expectations/tokens.json).
"""

from __future__ import annotations

from typing import Sequence

N = 4


def repetition(ids: Sequence[int], n: int = N) -> float:
    """seq-rep-n of `ids`: 0.0 when it has fewer than n + 1 tokens (no n-gram can repeat)."""
    total = len(ids) - n + 1
    if total < 2:
        return 0.0
    # The n-grams as tuples built by zip in C: 1.5x the speed of slicing a tuple per position
    # (0.18 s against 0.27 s for the 1.7M ids of bench/reconstruct.py's 6,000 rows), the same set.
    seen = set(zip(*(ids[k:] for k in range(n))))
    return 1.0 - len(seen) / total


def tenth(x: float) -> str:
    """The histogram bin of a repetition figure, as a key: "0.0" .. "0.9" (1.0 falls in "0.9")."""
    return f"{min(int(x * 10), 9) / 10:.1f}"
