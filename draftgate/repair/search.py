"""The tokenization of a row's text that the target most likely sampled, at the billed length.

A row rebuilt from text carries the canonical encoding C of its completion. Any other encoding of
the same bytes agrees with C up to some canonical token boundary, differs for a few tokens, and
re-joins C at a later canonical boundary: it is a set of disjoint WINDOWS, each starting with a
token other than C's at a boundary. So:

1. One pass over prompt + C (`Scorer.score`) gives, at every completion position t, the
   distribution given the canonical prefix: the log-probability of C[t] and of each ALTERNATIVE,
   a token whose bytes are a prefix of the text that remains from t (looked up by bytes in the
   contract's vocabulary, never by decoding strings). Special-token positions are never edited:
   only the text spans between them are re-segmented.
2. An alternative the sampler could plausibly have drawn (probability >= min_branch_prob, inside
   the nucleus) opens windows: every way to continue it with at most window_tokens tokens until a
   canonical boundary is reached (depth first, longest token first; window_candidates per branch,
   row_candidates per row, so a whitespace run cannot explode it). Each window is scored on the
   cached prefix (`Scorer.score_branches`) together with rejoin_tokens canonical tokens after it;
   its DELTA is that sum minus the canonical tokens' over the same span.
3. A dynamic programme over positions picks disjoint windows whose length changes sum to the bill
   (billed count under the provider's convention minus len(C)) with the largest total delta,
   keeping the two best solutions. Without a usable bill the length is free (flag `no_bill`).
4. The best and the runner-up are re-scored exactly: their ids from the first edit on, against
   the cached prefix, so the margins are full-sequence log-likelihood differences, not the sum of
   local deltas (windows interact when close).

Every candidate is built from tokens whose bytes tile the span exactly, so it decodes to the same
bytes by construction; `decodes_to` proves it again for the chosen ids.

Outcome per row (`Outcome`): `repaired` with the chosen ids, or `kept` with a reason:
`canonical` (the canonical encoding is the best at that length), `ambiguous` (best and
runner-up within ambiguous_margin nats), `no_candidate` (nothing reaches the billed length),
`budget` (the same, with candidates cut by a cap).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from draftgate.config import RepairParams
from draftgate.repair.score import Scorer

FLOOR = -1.0e4   # an impossible token (-inf) counts this much in sums, so deltas stay finite


class Vocab:
    """Every id's bytes, and the ordinary (non-added) ids by their bytes."""

    def __init__(self, pieces: Sequence[bytes], added: Sequence[bool]):
        self.pieces = list(pieces)
        self.added = frozenset(i for i, a in enumerate(added) if a)
        self.by_bytes: dict[bytes, int] = {}
        for i, b in enumerate(self.pieces):
            if i not in self.added and b:
                # Byte-level BPE spells every ordinary piece once; keep the lowest id if not.
                self.by_bytes.setdefault(b, i)
        self.lengths = sorted({len(b) for b in self.by_bytes}, reverse=True)

    @classmethod
    def from_tokenizer(cls, tok: Any) -> Vocab:
        return cls([tok.token_bytes(i) for i in range(tok.vocab_size)], [tok.is_added(i) for i in range(tok.vocab_size)])

    @classmethod
    def from_table(cls, table: Any) -> Vocab:
        """The contract's vocab.parquet (id, hex, added), the gates' source of token bytes."""
        d = table.to_pydict()
        order = sorted(range(len(d["id"])), key=lambda k: d["id"][k])
        if [d["id"][k] for k in order] != list(range(len(order))):
            raise ValueError("vocab table: ids are not 0..n-1; rerun the contract stage")
        return cls([bytes.fromhex(d["hex"][k]) for k in order], [bool(d["added"][k]) for k in order])

    def bytes_of(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.pieces[i] for i in ids)

    def prefixes(self, text: bytes, at: int) -> Iterator[int]:
        """Ordinary ids whose bytes are text[at:at+len], longest first."""
        rest = len(text) - at
        for n in self.lengths:
            if n <= rest:
                i = self.by_bytes.get(text[at:at + n])
                if i is not None:
                    yield i


@dataclass(frozen=True)
class Window:
    start: int                 # completion position of the first replaced token
    end: int                   # completion position where it re-joins the canonical ids
    ids: tuple[int, ...]
    delta: float = 0.0         # log-likelihood change against the canonical tokens (local)

    @property
    def length_change(self) -> int:
        return len(self.ids) - (self.end - self.start)


@dataclass
class Outcome:
    ids: list[int]                         # the row's completion ids after the search
    status: str                            # repaired | kept
    reason: str | None                     # kept: canonical | ambiguous | no_candidate | budget
    no_bill: bool
    target_len: int | None
    margin_runner_up: float | None         # nats: chosen minus the runner-up (None: no runner-up)
    margin_canonical: float | None         # nats: chosen minus the canonical encoding
    candidates: int                        # windows scored
    forwards: int
    tokens: int
    edits: list[Window] = field(default_factory=list)


def spans(completion: Sequence[int], vocab: Vocab) -> list[tuple[int, int]]:
    """[start, end) runs of ordinary ids: the text between special tokens."""
    out, start = [], None
    for t, i in enumerate(completion):
        if i in vocab.added:
            if start is not None:
                out.append((start, t))
                start = None
        elif start is None:
            start = t
    if start is not None:
        out.append((start, len(completion)))
    return out


def search(prompt: Sequence[int], completion: Sequence[int], target_len: int | None, scorer: Scorer,
           vocab: Vocab, params: RepairParams) -> Outcome:
    """Up to params.passes passes: each searches windows around the previous pass's choice (the
    first around the canonical encoding), so edits that only pay together (a repeated split, which
    the model copies once it has made it) are found; a pass that keeps its base ends the search."""
    canon = list(completion)
    f0, t0 = scorer.counters.forwards, scorer.counters.tokens
    no_bill = target_len is None
    out = Outcome(ids=canon, status="kept", reason=None, no_bill=no_bill, target_len=target_len,
                  margin_runner_up=None, margin_canonical=None, candidates=0, forwards=0, tokens=0)
    base, total_canon, ll = canon, None, None
    for k in range(params.passes):
        r = _pass(list(prompt), base, target_len, scorer, vocab, params)
        out.candidates += r.candidates
        if total_canon is None:
            total_canon = r.base_total
        if not r.ranked:
            if k == 0:
                out.reason = "budget" if r.truncated else "no_candidate"
                return _counted(out, scorer, f0, t0)
            break                       # no admissible alternative to the base: it stands
        ll, edits = r.ranked[0]
        out.margin_runner_up = ll - r.ranked[1][0] if len(r.ranked) > 1 else None
        if not edits:
            break
        base = _apply(base, edits)
    ll = r.base_total if ll is None or not r.ranked or not r.ranked[0][1] else ll
    out.margin_canonical = ll - total_canon
    admissible = no_bill or target_len == len(canon)
    if base == canon:
        out.reason = "canonical"
    elif out.margin_runner_up is not None and out.margin_runner_up < params.ambiguous_margin:
        out.reason = "ambiguous"
    elif admissible and out.margin_canonical < params.ambiguous_margin:
        out.reason = "ambiguous"      # the canonical encoding is admissible and nearly as likely
    else:
        out.ids, out.status = base, "repaired"
        out.edits = _edits(canon, base)
    return _counted(out, scorer, f0, t0)


@dataclass
class _Pass:
    base_total: float                                  # the base's log-likelihood (exact)
    ranked: list[tuple[float, tuple[Window, ...]]]     # the two best at the length, exact, best first
    candidates: int
    truncated: bool


def _pass(prompt: list[int], canon: list[int], target_len: int | None, scorer: Scorer, vocab: Vocab,
          params: RepairParams) -> _Pass:
    import math

    base = prompt + canon
    p0 = len(prompt)
    # Alternatives at each position of each text span, by bytes.
    alts: list[list[int]] = [[] for _ in canon]
    boundary: dict[int, dict[int, int]] = {}    # span start -> {byte offset: position}
    text_of: dict[int, bytes] = {}
    span_of: dict[int, int] = {}
    offset: dict[int, int] = {}
    for s, e in spans(canon, vocab):
        text = vocab.bytes_of(canon[s:e])
        text_of[s] = text
        offs, o = {}, 0
        for t in range(s, e):
            offs[o] = t
            offset[t], span_of[t] = o, s
            o += len(vocab.pieces[canon[t]])
        offs[o] = e
        boundary[s] = offs
        for t in range(s, e):
            alts[t] = [a for a in vocab.prefixes(text, offset[t]) if a != canon[t]]

    scored = scorer.score(base, p0, alts)
    lp = [max(v, FLOOR) for v in scored.logprobs]

    # Branch points, most probable first (the caps cut the least likely).
    floor_lp = math.log(params.min_branch_prob) if params.min_branch_prob > 0 else -math.inf
    ratio_lp = math.log(params.min_branch_ratio) if params.min_branch_ratio > 0 else -math.inf
    branches = sorted(((v, t, a) for t in range(len(canon)) for a, v in scored.asked[t].items()
                       if v > -math.inf and (v >= floor_lp or v - lp[t] >= ratio_lp)), reverse=True)
    windows: list[Window] = []
    truncated = False
    for _, t, a in branches:
        if len(windows) >= params.row_candidates:
            truncated = True
            break
        s = span_of[t]
        for w in _windows(text_of[s], boundary[s], offset[t] + len(vocab.pieces[a]), [a], vocab, params):
            end = boundary[s][_end_offset(vocab, text_of[s], offset[t], w)]
            windows.append(Window(t, end, tuple(w)))
            if len(windows) >= params.row_candidates:
                truncated = True
                break

    # Score windows with their re-join tokens, on the cached prefix. A window's delta is at most
    # its first token's log-probability (known) minus the canonical span's (the rest is <= 0).
    # Where the length may stay (bill agrees, or no bill) a change needs a window that gains, so
    # those are scored first; the others only matter as partners of a gain of opposite length,
    # and are scored only when a gain exists. Exact rows, the many, mostly stop after the first.
    la = params.rejoin_tokens
    want = None if target_len is None else target_len - len(canon)
    first_lp = {(t, a): v for t in range(len(canon)) for a, v in scored.asked[t].items()}
    ref = [sum(lp[w.start:w.end + min(la, len(canon) - w.end)]) for w in windows]
    ub = [first_lp[(w.start, w.ids[0])] - r for w, r in zip(windows, ref)]
    order = list(range(len(windows)))
    if want is None or want == 0:
        gains = [k for k in order if ub[k] > 0]
        stages = [gains, [k for k in order if ub[k] <= 0]] if want == 0 else [gains]
    else:
        stages = [order]
    scored_windows = []
    for n, stage in enumerate(stages):
        if n and not any(w.delta > 0 for w in scored_windows):
            break
        requests = [(p0 + windows[k].start, list(windows[k].ids) + canon[windows[k].end:windows[k].end + la])
                    for k in stage]
        results = scorer.score_branches(base, requests) if requests else []
        for k, got in zip(stage, results):
            w = windows[k]
            if min(got[:len(w.ids)]) == -math.inf:
                continue                              # a window the sampler could not have drawn
            scored_windows.append(Window(w.start, w.end, w.ids, sum(max(v, FLOOR) for v in got) - ref[k]))
    scored_count = sum(len(st) for st in stages[:1]) + (len(stages[1]) if len(stages) > 1 and any(
        w.delta > 0 for w in scored_windows) else 0)

    best = _best_two(len(canon), scored_windows, want, params.max_length_delta)
    # Exact log-likelihoods of the two best (from their first edit on, on the cached prefix).
    total = sum(lp)
    ranked = []
    for k, edits in enumerate(best):
        if not edits:
            ranked.append((total, edits))
            continue
        if k and not best[0]:
            # The base won locally: it stays whatever the runner-up's exact score, so the runner-up
            # is not re-scored (on exact rows that tail pass was ~40% of the search's tokens); its
            # margin is the local one.
            ranked.append((total + sum(w.delta for w in edits), edits))
            continue
        ids = _apply(canon, edits)
        first = edits[0].start
        tail = scorer.score_branches(base, [(p0 + first, ids[first:])])[0]
        ranked.append((sum(lp[:first]) + sum(max(v, FLOOR) for v in tail), edits))
    ranked.sort(key=lambda x: -x[0])
    return _Pass(total, ranked, scored_count, truncated)


def _edits(canon: Sequence[int], ids: Sequence[int]) -> list[Window]:
    """The changed span as one window (prefix and suffix in common cut), for the record."""
    from draftgate.reconstruct.classify import differing_span, first_difference

    i = first_difference(canon, ids)
    a, b = differing_span(canon, ids, i)
    return [Window(i, i + a, tuple(ids[i:i + b]))]


def decodes_to(ids: Sequence[int], text: bytes, vocab: Vocab) -> bool:
    return vocab.bytes_of(ids) == text


def _counted(out: Outcome, scorer: Scorer, f0: int, t0: int) -> Outcome:
    out.forwards, out.tokens = scorer.counters.forwards - f0, scorer.counters.tokens - t0
    return out


def _windows(text: bytes, offs: dict[int, int], at: int, path: list[int], vocab: Vocab,
             params: RepairParams) -> Iterator[list[int]]:
    """Continuations of `path` (which ends at byte `at`) up to the first canonical boundary."""
    count = 0

    def walk(at: int, path: list[int]) -> Iterator[list[int]]:
        nonlocal count
        if at in offs:
            count += 1
            yield list(path)
            return
        if len(path) >= params.window_tokens:
            return
        for i in vocab.prefixes(text, at):
            if count >= params.window_candidates:
                return
            path.append(i)
            yield from walk(at + len(vocab.pieces[i]), path)
            path.pop()

    yield from walk(at, path)


def _end_offset(vocab: Vocab, text: bytes, start: int, ids: Sequence[int]) -> int:
    return start + sum(len(vocab.pieces[i]) for i in ids)


def _apply(canon: Sequence[int], edits: Sequence[Window]) -> list[int]:
    out, t = [], 0
    for w in edits:
        out += canon[t:w.start]
        out += w.ids
        t = w.end
    return out + list(canon[t:])


def _best_two(n: int, windows: Sequence[Window], want: int | None, max_delta: int) -> list[tuple[Window, ...]]:
    """The two best sets of disjoint windows: total length change == want (None: any), by total
    delta. The empty set (the canonical encoding) competes where its length is admissible."""
    by_start: dict[int, list[Window]] = {}
    for w in windows:
        by_start.setdefault(w.start, []).append(w)
    # states[i]: length change -> up to two (score, edits) reaching position i.
    states: list[dict[int, list[tuple[float, tuple[Window, ...]]]]] = [dict() for _ in range(n + 1)]
    states[0][0] = [(0.0, ())]

    def offer(i: int, d: int, entry: tuple[float, tuple[Window, ...]]) -> None:
        if abs(d) > max_delta:
            return
        cur = states[i].setdefault(d, [])
        cur.append(entry)
        cur.sort(key=lambda x: -x[0])
        del cur[2:]

    for i in range(n):
        for d, entries in states[i].items():
            for e in entries:
                offer(i + 1, d, e)
                for w in by_start.get(i, ()):
                    offer(w.end, d + w.length_change, (e[0] + w.delta, e[1] + (w,)))
        states[i] = {}   # no longer needed
    final = states[n]
    pool = final.get(want, []) if want is not None else [e for es in final.values() for e in es]
    pool = sorted(pool, key=lambda x: -x[0])[:2]
    return [edits for _, edits in pool]
