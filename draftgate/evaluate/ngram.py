"""vLLM's n-gram (prompt lookup) proposer rule, as a pure function (docs/evaluation.md).

The longest suffix n-gram of prompt + output, n from `n_max` down to `n_min`, that also occurs
earlier in the sequence; of its occurrences, the earliest; propose up to k tokens that follow it.
vLLM's default when neither bound is set is 5..5.
"""

from __future__ import annotations

from typing import Sequence


def propose(tokens: Sequence[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Draft up to `k` tokens continuing `tokens` by prompt lookup; [] when no n-gram recurs."""
    if k < 1 or n_min < 1 or n_min > n_max:
        raise ValueError(f"need k >= 1 and 1 <= n_min <= n_max, got k={k}, n_min={n_min}, n_max={n_max}")
    seq = list(tokens)
    size = len(seq)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = seq[size - n:]
        first = suffix[0]
        # Occurrences that end before the suffix itself starts ending: start < size - n.
        for start in range(size - n):
            if seq[start] == first and seq[start:start + n] == suffix:
                return seq[start + n:start + n + k]
    return []


def replay(prompt: Sequence[int], output: Sequence[int], k: int, n_min: int, n_max: int
           ) -> tuple[list[int], list[int], list[int]]:
    """The verify steps this rule would take to produce `output` (drafted, accepted, emitted).

    Exact without the target: greedy speculative decoding emits the target's greedy ids whatever
    the proposer (docs/evaluation.md), so the ids a verified run produced say which draft tokens
    the target accepts. `output[0]` came from the prefill. Only the last step's accepted count
    can fall short of a real run's: past the stop the real target may still agree with a draft.
    """
    drafted, accepted, emitted = [], [], []
    ctx = list(prompt) + list(output[:1])
    pos = 1
    while pos < len(output):
        draft = propose(ctx, k, n_min, n_max)
        a = 0
        while a < len(draft) and pos + a < len(output) and draft[a] == output[pos + a]:
            a += 1
        e = min(a + 1, len(output) - pos)
        drafted.append(len(draft))
        accepted.append(a)
        emitted.append(e)
        ctx.extend(output[pos:pos + e])
        pos += e
    return drafted, accepted, emitted
