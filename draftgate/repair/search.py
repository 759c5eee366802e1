"""The tokenization of a row's text that the target most likely sampled, at the billed length.

A row rebuilt from text carries the canonical encoding C of its completion. Any other encoding of
the same bytes agrees with C up to some canonical token boundary, differs for a few tokens, and
re-joins C at a later canonical boundary: it is a set of disjoint WINDOWS, each starting with a
token other than C's at a boundary. So:

1. One pass over prompt + C (`Scorer.score`; `Scorer.score_rows` batches it over many rows,
   `search_rows`) gives, at every completion position t, the distribution given the canonical
   prefix: the log-probability of C[t] and of each ALTERNATIVE, a token whose bytes are a prefix
   of the text that remains from t (looked up by bytes in the contract's vocabulary, never by
   decoding strings). Special-token positions are never edited: only the text spans between them
   are re-segmented.
2. Every alternative inside the nucleus opens windows: every way to continue it with at most
   window_tokens tokens until a canonical boundary is reached (depth first, longest token first;
   window_candidates per branch, so a whitespace run cannot explode it). A window's DELTA is its
   log-likelihood, with rejoin_tokens canonical tokens after it, minus the canonical tokens' over
   the same span; its first token's log-probability minus the canonical span's bounds it.
3. A dynamic programme over positions picks disjoint windows whose length changes sum to the bill
   (billed count under the provider's convention minus len(C)) with the largest total delta,
   keeping the `beam` best; branch and bound scores (`Scorer.score_branches`, on the cached prefix)
   only the windows that, by their bounds, could enter the contenders: the best two, and the
   others within rescore_margin nats of the best (`_pass`, `_contenders`); a round's spare slots
   go to the windows of highest max-marginal (the best split at the length that holds them), so
   row_candidates is spent best first. Without a usable bill the length is free (flag `no_bill`).
   Where row_candidates runs out first, the choice is made among the scored windows and the row
   says so (`Outcome.capped`).
4. The contenders are re-scored exactly: their ids from the first edit on, against the cached
   prefix, so the margins are full-sequence log-likelihood differences, not the sum of local
   deltas (windows interact when close). The winner's re-score is the next pass's base.
5. The winner's CONFIDENCE is its share of the likelihood of every split at the length (`_log_mass`:
   the same programme summing instead of maximising; unscored windows at their bound, those the
   cap left out included, so it errs low): the posterior that the choice is what was sampled.

Every candidate is built from tokens whose bytes tile the span exactly, so it decodes to the same
bytes by construction; `decodes_to` proves it again for the chosen ids.

Outcome per row (`Outcome`): `repaired` with the chosen ids, or `kept` with a reason:
`canonical` (the canonical encoding is the best at that length), `ambiguous` (the canonical
encoding is admissible and the best is within ambiguous_margin nats of the runner-up or of it),
`no_candidate` (nothing reaches the billed length), `budget` (the same, with candidates cut by
row_candidates).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from draftgate.config import RepairParams
from draftgate.repair.score import Scored, Scorer

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
    confidence: float | None               # the choice's posterior among the splits at the length
    confidence_hi: float | None            # the same over the scored windows only (errs high)
    candidates: int                        # windows scored
    forwards: int
    tokens: int
    edits: list[Window] = field(default_factory=list)
    passes: int = 0
    # A pass spent row_candidates windows while windows that could enter its contenders were still
    # unscored: the choice was made among the scored ones (it may be a search miss), and the
    # confidence's low estimate counts the unscored at their bound (so it still errs low).
    capped: bool = False
    # phase -> [forwards, tokens, seconds]: base (the first pass over prompt + canonical ids),
    # windows (scoring candidate windows), rescore (exact scores of the contenders, later bases).
    phases: dict[str, list[float]] = field(default_factory=dict)


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
           vocab: Vocab, params: RepairParams, base: Scored | None = None) -> Outcome:
    """Up to params.passes passes: each searches windows around the previous pass's choice (the
    first around the canonical encoding), so edits that only pay together (a repeated split, which
    the model copies once it has made it) are found; a pass that keeps its base ends the search.
    `base`: the first pass's scores of prompt + completion, when a batched call made them
    (`search_rows`); else the search scores it."""
    canon = list(completion)
    f0, t0 = scorer.counters.forwards, scorer.counters.tokens
    no_bill = target_len is None
    out = Outcome(ids=canon, status="kept", reason=None, no_bill=no_bill, target_len=target_len,
                  margin_runner_up=None, margin_canonical=None, confidence=None, confidence_hi=None, candidates=0, forwards=0,
                  tokens=0)
    clock = _Clock(scorer, out.phases)
    prompt = list(prompt)
    ids, known = canon, {}
    if base is None:
        with clock("base"):
            base = scorer.score(prompt + canon, len(prompt), alternatives(canon, vocab))
    total_canon = ll = None
    for k in range(params.passes):
        r = _pass(prompt, ids, base, target_len, scorer, vocab, params, known, clock)
        out.candidates += r.candidates
        out.passes = k + 1
        out.capped = out.capped or r.truncated
        if total_canon is None:
            total_canon = r.base_total
        if not r.ranked:
            if k == 0:
                out.reason = "budget" if r.truncated else "no_candidate"
                return _counted(out, scorer, f0, t0)
            break                       # no admissible alternative to the base: it stands
        ll = r.ranked[0][0]
        out.margin_runner_up = ll - r.ranked[1][0] if len(r.ranked) > 1 else None
        # The winner's share of the mass of every split at the length, from this pass's lattice.
        out.confidence = min(1.0, math.exp(ll - r.base_total - r.log_mass))
        out.confidence_hi = min(1.0, math.exp(ll - r.base_total - r.log_mass_scored))
        if r.next_ids is None:
            break
        known = r.carry
        ids, base = r.next_ids, r.next_base
    out.margin_canonical = (ll if ll is not None else total_canon) - total_canon
    # Ambiguity keeps a row only where its ids may be right as they are: the canonical encoding
    # is admissible (no bill, or the bill's length). Where the bill rules it out, the text
    # method's ids are wrong for certain and the best is right at odds e^margin : 1 against the
    # runner-up, so the row takes it, its small margin recorded (T 1.0 code: 2 of 24 rows).
    admissible = no_bill or target_len == len(canon)
    if ids == canon:
        out.reason = "canonical"
    elif admissible and out.margin_runner_up is not None and out.margin_runner_up < params.ambiguous_margin:
        out.reason = "ambiguous"
    elif admissible and out.margin_canonical < params.ambiguous_margin:
        out.reason = "ambiguous"      # the canonical encoding is nearly as likely
    else:
        out.ids, out.status = ids, "repaired"
        out.edits = _edits(canon, ids)
    return _counted(out, scorer, f0, t0)


def search_rows(rows: Sequence[tuple[Sequence[int], Sequence[int], int | None]], scorer: Scorer, vocab: Vocab,
                params: RepairParams, prefill: Callable[[list[tuple[int, Any]]], None] | None = None
                ) -> Iterator[Outcome]:
    """`search` over many rows (prompt, completion, target_len), the first pass of each batched
    the way the hidden stage batches its forward (`Scorer.score_rows`: rows sorted by length,
    about params.batch_tokens padded tokens per pass). Outcomes come in the rows' order; the base
    pass's cost is spread over the batch's rows (phase `base`). `prefill`, once per batch before
    its caches are released: [(row index, the features the scorer captured in the base pass)] for
    the batch's rows whose search left their ids as they were (the hidden stage's prefill)."""
    rows = list(rows)
    order = sorted(range(len(rows)), key=lambda i: (-(len(rows[i][0]) + len(rows[i][1])), i))
    done: dict[int, Outcome] = {}
    nxt = 0
    k = 0
    while k < len(order):
        width = len(rows[order[k]][0]) + len(rows[order[k]][1])
        chunk = order[k:k + max(1, params.batch_tokens // max(1, width))]
        k += len(chunk)
        f0, t0, c0 = scorer.counters.forwards, scorer.counters.tokens, time.perf_counter()
        scored = scorer.score_rows([(list(rows[i][0]) + list(rows[i][1]), len(rows[i][0]),
                                     alternatives(rows[i][1], vocab)) for i in chunk])
        share = [(scorer.counters.forwards - f0) / len(chunk), (scorer.counters.tokens - t0) / len(chunk),
                 (time.perf_counter() - c0) / len(chunk)]
        for i, s in zip(chunk, scored):
            prompt, completion, target = rows[i]
            out = search(prompt, completion, target, scorer, vocab, params, base=s)
            out.phases["base"] = list(share)
            out.forwards += share[0]
            out.tokens += share[1]
            done[i] = out
        if prefill is not None:
            prefill([(i, scorer.features(list(rows[i][0]) + list(rows[i][1]))) for i in chunk
                     if done[i].status != "repaired"])
        scorer.release()
        while nxt in done:
            yield done.pop(nxt)
            nxt += 1


def alternatives(ids: Sequence[int], vocab: Vocab) -> list[list[int]]:
    """Per position of ids: the ordinary ids other than ids[t] whose bytes are a prefix of the text
    that remains from t within its text span (special positions have none)."""
    alts: list[list[int]] = [[] for _ in ids]
    for s, e in spans(ids, vocab):
        text = vocab.bytes_of(ids[s:e])
        o = 0
        for t in range(s, e):
            alts[t] = [a for a in vocab.prefixes(text, o) if a != ids[t]]
            o += len(vocab.pieces[ids[t]])
    return alts


class _Clock:
    """Forwards, tokens and seconds per phase (base | windows | rescore) into Outcome.phases."""

    def __init__(self, scorer: Scorer, phases: dict[str, list[float]]):
        self.scorer, self.phases = scorer, phases

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        c = self.scorer.counters
        f, t, s = c.forwards, c.tokens, time.perf_counter()
        try:
            yield
        finally:
            acc = self.phases.setdefault(phase, [0.0, 0.0, 0.0])
            acc[0] += c.forwards - f
            acc[1] += c.tokens - t
            acc[2] += time.perf_counter() - s


@dataclass
class _Pass:
    base_total: float                                  # the base's log-likelihood (exact)
    log_mass: float                                    # log sum over splits at the length, base = 0
    log_mass_scored: float                             # the same over scored windows only
    ranked: list[tuple[float, tuple[Window, ...]]]     # the contenders at the length, exact, best first
    candidates: int
    truncated: bool
    next_ids: list[int] | None = None                  # the winner, where it is not the base
    next_base: Scored | None = None                    # its scores (the exact re-score of the winner)
    carry: dict = field(default_factory=dict)          # window deltas still valid on the winner


def _pass(prompt: list[int], canon: list[int], scored: Scored, target_len: int | None, scorer: Scorer,
          vocab: Vocab, params: RepairParams, known: dict, clock: _Clock) -> _Pass:
    """One pass around `canon` (the base: the canonical ids, or the previous pass's choice) whose
    scores are `scored`.

    Every alternative opens windows (no probability threshold: with a bill that asks for another
    length, the best window of that length change wins however unlikely it is next to the base).
    Each window has an UPPER BOUND on its delta from the base pass alone: its first token's
    log-probability minus the base's over the span and the re-join (the rest is <= 0). The search
    is branch and bound over those: the dynamic programme runs on exact deltas where scored and
    bounds elsewhere; the unscored windows in its contenders (the best one, where that is the base)
    are scored, with the next by max-marginal, in one tree-masked forward; until the contenders are
    exact. So only windows that could enter the contenders are scored: on exact rows, the few whose
    bound beats the base. (Filling the rounds by max-marginal rather than bare bound halved the
    windows scored on tests/test_repair_search.py's four rows, 82/208/48/112 -> 34/48/16/32, for
    the same choices.) Where row_candidates runs out first, the pass is `truncated`."""
    base = prompt + canon
    p0 = len(prompt)
    lp = [max(v, FLOOR) for v in scored.logprobs]
    la = params.rejoin_tokens
    want = None if target_len is None else target_len - len(canon)

    # Every window, with its bound; windows a previous pass scored (before its first edit) keep
    # their exact delta.
    windows: list[Window] = []
    bound: list[float] = []
    for s, e in spans(canon, vocab):
        text = vocab.bytes_of(canon[s:e])
        offs, o = {}, 0
        for t in range(s, e):
            offs[o] = t
            o += len(vocab.pieces[canon[t]])
        offs[o] = e
        inv = {v: k for k, v in offs.items()}
        for t in range(s, e):
            for a, v in scored.asked[t].items():
                if v == -math.inf:
                    continue                          # outside the nucleus: the sampler could not
                for w in _windows(text, offs, inv[t] + len(vocab.pieces[a]), [a], vocab, params):
                    end = offs[inv[t] + sum(len(vocab.pieces[i]) for i in w)]
                    windows.append(Window(t, end, tuple(w)))
                    bound.append(v - sum(lp[t:min(len(canon), end + la)]))
    value: dict[int, float] = {}              # index -> exact local delta; -inf: impossible
    for k, w in enumerate(windows):
        d = known.get((w.start, w.end, w.ids))
        if d is not None:
            value[k] = d
    truncated = False
    candidates = 0

    def score(batch: list[int]) -> None:
        nonlocal candidates
        requests = [(p0 + windows[k].start, list(windows[k].ids) + canon[windows[k].end:windows[k].end + la])
                    for k in batch]
        with clock("windows"):
            results = scorer.score_branches(base, requests)
        candidates += len(batch)
        for k, got in zip(batch, results):
            w = windows[k]
            ref = sum(lp[w.start:min(len(canon), w.end + la)])
            value[k] = -math.inf if min(got[:len(w.ids)]) == -math.inf else sum(max(v, FLOOR) for v in got) - ref

    def current() -> list[float]:
        # Exact where scored; unscored windows at their bound, or out of the running (-inf) once
        # the cap cut the search (the decision is then made among scored windows only).
        return [value.get(k, -math.inf if truncated else bound[k]) for k in range(len(windows))]

    while True:
        vals = current()
        best = _contenders(_best(len(canon), windows, vals, want, params.max_length_delta, params.beam),
                           params.rescore_margin)
        need = [k for sol in best for k in sol if k not in value] if best and best[0] else []
        if not need:
            break
        room = params.row_candidates - candidates
        if room <= 0:
            # Windows that could enter the contenders were left unscored: the row says so
            # (Outcome.capped, column repair_capped), and the confidence's low estimate still
            # counts them at their bound (below), so it keeps erring low.
            truncated = True
            best = _contenders(_best(len(canon), windows, current(), want, params.max_length_delta, params.beam),
                               params.rescore_margin)
            break
        taken = list(dict.fromkeys(need))[:room]
        fill = max(0, min(room, params.window_batch) - len(taken))
        if fill:
            # The round's other slots go to the windows most likely to be asked for next: by their
            # max-marginal (the best split at the length that holds them, on current values), not
            # their bare bound, which ignores whether a split at the bill's length can hold them.
            # So the row_candidates cap is spent best-first, on windows that could still win.
            mm = _max_marginals(len(canon), windows, vals, want, params.max_length_delta)
            chosen = set(taken)
            rest = sorted((k for k in range(len(windows)) if k not in value and k not in chosen and mm[k] > -math.inf),
                          key=lambda k: (-mm[k], -bound[k], k))
            taken += rest[:fill]
        score(taken)
    # The decision is made; the rest only sharpens the confidence: unscored windows that could
    # sit in a split within confidence_nats of the best (by their bounds) are scored, so the mass
    # counts them at their value, not at a bound that is often nats too high. Scoring can only
    # lower a value, so the contenders stay as they are.
    while params.confidence_nats > 0 and not truncated and candidates < params.row_candidates:
        vals = [value.get(k, bound[k]) for k in range(len(windows))]
        top = _best(len(canon), windows, vals, want, params.max_length_delta, 1)
        if not top:
            break
        mm = _max_marginals(len(canon), windows, vals, want, params.max_length_delta)
        todo = sorted((k for k in range(len(windows)) if k not in value and mm[k] >= top[0][0] - params.confidence_nats),
                      key=lambda k: -mm[k])
        if not todo:
            break
        score(todo[:min(params.row_candidates - candidates, params.window_batch)])

    total = sum(lp)
    mass = _log_mass(len(canon), windows, [value.get(k, bound[k]) for k in range(len(windows))], want,
                     params.max_length_delta)
    mass_scored = _log_mass(len(canon), windows, [value.get(k, -math.inf) for k in range(len(windows))],
                            want, params.max_length_delta)
    decided = current()
    picked = [sol for sol in best if all(decided[k] > -math.inf for k in sol)]
    sols = [tuple(windows[k] for k in sol) for sol in picked]
    # Exact log-likelihoods of the contenders (from their first edit on, on the cached prefix). The
    # winner's re-score is the next pass's base pass (the scorer reuses the prefix before its
    # first edit), so it is asked for its alternatives too.
    ranked: list[tuple[float, tuple[Window, ...]]] = []
    for k, edits in enumerate(sols):
        if not edits:
            ranked.append((total, edits))
        elif not sols[0]:
            # The base won: it stays whatever the runner-up's exact score, so the runner-up is not
            # re-scored; its margin is the local one (a bound where a delta was not scored).
            ranked.append((total + sum(decided[i] for i in picked[k]), edits))
        elif k:
            ids = _apply(canon, edits)
            first = edits[0].start
            with clock("rescore"):
                tail = scorer.score_branches(base, [(p0 + first, ids[first:])])[0]
            ranked.append((sum(lp[:first]) + sum(max(v, FLOOR) for v in tail), edits))
    nxt = None
    if sols and sols[0]:
        ids = _apply(canon, sols[0])
        with clock("rescore"):
            nxt = scorer.score(prompt + ids, p0, alternatives(ids, vocab))
        ranked.append((sum(max(v, FLOOR) for v in nxt.logprobs), sols[0]))
    ranked.sort(key=lambda x: -x[0])
    out = _Pass(total, mass, mass_scored, ranked, candidates, truncated)
    if ranked and ranked[0][1]:
        win = ranked[0][1]
        out.next_ids = _apply(canon, win)
        if win is sols[0]:
            out.next_base = nxt
        else:
            # The exact re-score reversed the local order: the runner-up wins; score it as a base.
            with clock("rescore"):
                out.next_base = scorer.score(prompt + out.next_ids, p0, alternatives(out.next_ids, vocab))
        first = win[0].start
        out.carry = {(w.start, w.end, w.ids): value[k] for k, w in enumerate(windows)
                     if k in value and w.end + la <= first}
    return out


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


def _by_start(windows: Sequence[Window], value: Sequence[float]) -> dict[int, list[int]]:
    """The possible windows (value above -inf), by the position they start at."""
    out: dict[int, list[int]] = {}
    for k, w in enumerate(windows):
        if value[k] > -math.inf:
            out.setdefault(w.start, []).append(k)
    return out


def _contenders(best: list[tuple[float, tuple[int, ...]]], margin: float) -> list[tuple[int, ...]]:
    """The solutions the pass ranks exactly: the best two and every other within `margin` nats of
    the best, so near-ties are settled by exact re-scoring (the local order of three splits 0.1
    nat apart is noise: demo row `])|)))` vs `])))|)`). Where the base leads, it stands (every
    other is below it even at its bound): the base and the runner-up, for the margin."""
    if best and not best[0][1]:
        return [sol for _, sol in best[:2]]
    return [sol for k, (v, sol) in enumerate(best) if k < 2 or v >= best[0][0] - margin]


def _best(n: int, windows: Sequence[Window], value: Sequence[float], want: int | None,
          max_delta: int, keep: int = 2) -> list[tuple[float, tuple[int, ...]]]:
    """The `keep` best sets of disjoint windows (score, indices): total length change == want
    (None: any), by total value. The empty set (the base) competes where its length is
    admissible; windows valued -inf are out. Keeping the `keep` best per state is exact for the
    `keep` best overall (each extends a state's best)."""
    by_start = _by_start(windows, value)
    # states[i]: length change -> up to `keep` (score, window indices) reaching position i.
    states: list[dict[int, list[tuple[float, tuple[int, ...]]]]] = [dict() for _ in range(n + 1)]
    states[0][0] = [(0.0, ())]

    def offer(i: int, d: int, entry: tuple[float, tuple[int, ...]]) -> None:
        if abs(d) > max_delta:
            return
        cur = states[i].setdefault(d, [])
        if len(cur) < keep:
            cur.append(entry)
            cur.sort(key=lambda x: -x[0])
        elif entry[0] > cur[-1][0]:
            cur[-1] = entry
            cur.sort(key=lambda x: -x[0])

    for i in range(n):
        starting = by_start.get(i, ())
        for d, entries in states[i].items():
            for e in entries:
                offer(i + 1, d, e)
                for k in starting:
                    w = windows[k]
                    offer(w.end, d + w.length_change, (e[0] + value[k], e[1] + (k,)))
        states[i] = {}   # no longer needed
    final = states[n]
    pool = final.get(want, []) if want is not None else [e for es in final.values() for e in es]
    return sorted(pool, key=lambda x: -x[0])[:keep]


def _max_marginals(n: int, windows: Sequence[Window], value: Sequence[float], want: int | None,
                   max_delta: int) -> list[float]:
    """Per window: the best score of a set of disjoint windows at the length that holds it (-inf:
    none), by a forward programme (best to each position and length change) and a backward one
    (best from each position for each change still to make)."""
    by_start = _by_start(windows, value)
    fwd: list[dict[int, float]] = [dict() for _ in range(n + 1)]
    fwd[0][0] = 0.0
    for i in range(n):
        for d, v in fwd[i].items():
            if v > fwd[i + 1].get(d, -math.inf):
                fwd[i + 1][d] = v
            for k in by_start.get(i, ()):
                w, e = windows[k], d + windows[k].length_change
                if abs(e) <= max_delta and v + value[k] > fwd[w.end].get(e, -math.inf):
                    fwd[w.end][e] = v + value[k]
    bwd: list[dict[int, float]] = [dict() for _ in range(n + 1)]
    bwd[n][0] = 0.0
    for i in range(n - 1, -1, -1):
        cur = dict(bwd[i + 1])
        for k in by_start.get(i, ()):
            w = windows[k]
            for r, v in bwd[w.end].items():
                c = r + w.length_change
                if abs(c) <= 2 * max_delta and v + value[k] > cur.get(c, -math.inf):
                    cur[c] = v + value[k]
        bwd[i] = cur
    out = []
    for k, w in enumerate(windows):
        best = -math.inf
        if value[k] > -math.inf:
            for d, v in fwd[w.start].items():
                rest = bwd[w.end]
                tail = (rest.get(want - d - w.length_change, -math.inf) if want is not None
                        else max(rest.values(), default=-math.inf))
                best = max(best, v + value[k] + tail)
        out.append(best)
    return out


def _log_mass(n: int, windows: Sequence[Window], value: Sequence[float], want: int | None,
              max_delta: int) -> float:
    """log of the summed likelihood (relative to the base) of every set of disjoint windows whose
    length change is want (None: any): `_best`'s programme with (logsumexp, +) for (max, +).

    The denominator of a choice's posterior. Windows not scored count at their upper bound, so
    the mass is over-counted and the posterior it gives errs low; window interactions are
    ignored (local deltas), as in the search itself."""
    by_start = _by_start(windows, value)
    states: list[dict[int, float]] = [dict() for _ in range(n + 1)]
    states[0][0] = 0.0

    def add(i: int, d: int, v: float) -> None:
        if abs(d) <= max_delta:
            cur = states[i].get(d)
            states[i][d] = v if cur is None else max(cur, v) + math.log1p(math.exp(-abs(cur - v)))

    for i in range(n):
        for d, v in states[i].items():
            add(i + 1, d, v)
            for k in by_start.get(i, ()):
                w = windows[k]
                add(w.end, d + w.length_change, v + value[k])
        states[i] = {}
    final = states[n]
    if want is not None:
        return final.get(want, -math.inf)
    top = max(final.values())
    return top + math.log(sum(math.exp(v - top) for v in final.values()))
