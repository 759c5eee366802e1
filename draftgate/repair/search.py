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
   the same span. The windows form a TRIE of branch tokens: windows that start alike share their
   prefix, and a node (a prefix) is scored once for all of them (`Scorer.score_nodes`: one
   forwarded token on the cached prefix, which yields the next token's log-probability for every
   window through it). What is known of a window bounds its delta: the log-probabilities of the
   branch tokens scored so far minus the canonical span's (the rest is <= 0); after its first
   token only (from the base pass) that is the bound, and it tightens a token per node scored.
   Through an engine a token below its top k is itself known only from above (score.py `Bound`):
   such a window is exact once a request carrying that token in its prompt returns its value.
3. A dynamic programme over positions picks disjoint windows whose length changes sum to the bill
   (billed count under the provider's convention minus len(C)) with the largest total delta,
   keeping the `beam` best; branch and bound scores only the nodes of windows that, by their
   bounds, could win or be re-ranked against the winner: the leader and the splits within
   max(rescore_margin, ambiguous_margin) of it (`_pass`); a leading base stands unscored (but
   for its rivals within rival_margin, scored and re-scored over the row where asked). A
   round's spare nodes go to the windows of highest max-marginal (the best split at the length
   that holds them), so search_tokens is spent best first; windows whose max-marginal falls far
   below a split known exactly leave the rounds (PRUNE_SLACK). Without a usable bill the length
   is free (flag `no_bill`). Where search_tokens runs out first, the choice is made among the
   scored windows and the row says so (`Outcome.capped`). The searches of a base-pass batch run
   in step (`_drive`): every row's round of nodes is one forward (`Scorer.score_nodes_many`).
4. The contenders are re-scored exactly: their ids from the first edit on, against the cached
   prefix, so the margins are full-sequence log-likelihood differences, not the sum of local
   deltas (windows interact when close). The winner's re-score is the next pass's base.
5. The winner's CONFIDENCE is its share of the likelihood of every split at the length (`_log_mass`:
   the same programme summing instead of maximising; unscored windows at their bound, those the
   cap left out included, so it errs low; the splits re-scored in 4 at their exact score): the
   posterior that the choice is what was sampled.

Every candidate is built from tokens whose bytes tile the span exactly, so it decodes to the same
bytes by construction; `decodes_to` proves it again for the chosen ids.

Outcome per row (`Outcome`): `repaired` with the chosen ids, or `kept` with a reason:
`canonical` (the canonical encoding is the best at that length), `ambiguous` (the canonical
encoding is admissible and the best is within ambiguous_margin nats of the runner-up or of it),
`no_candidate` (nothing reaches the billed length), `budget` (the same, with the search cut by
search_tokens).
"""

from __future__ import annotations

import copy
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, Sequence

from draftgate.config import RepairParams
from draftgate.repair.score import Bound, Scored, Scorer

NEXT, PATH = "next", "path"     # what a trie node is asked for (_pass)
FLOOR = -1.0e4   # an impossible token (-inf) counts this much in sums, so deltas stay finite
# A window whose best split (on bounds) is further below a split known exactly than the larger of
# rescore_margin and confidence_nats plus this leaves the search's rounds: it can be neither a
# contender nor scored for the confidence; the confidence's mass still counts it at its bound.
PRUNE_SLACK = 4.0


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

    @functools.cached_property
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
    candidates: int                        # windows whose delta was scored
    forwards: int
    tokens: int
    edits: list[Window] = field(default_factory=list)
    passes: int = 0
    # A pass spent search_tokens nodes while windows that could enter its contenders were still
    # unscored: the choice was made among the scored ones (it may be a search miss), and the
    # confidence's low estimate counts the unscored at their bound (so it still errs low).
    capped: bool = False
    nodes: int = 0                         # trie nodes scored (one forwarded branch token each)
    # phase -> [forwards, tokens, seconds]: base (the first pass over prompt + canonical ids),
    # windows (scoring the windows that decide), confidence (scoring windows near the best for the
    # confidence only), rescore (exact scores of the contenders, later bases).
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
    return _drive([_search(prompt, completion, target_len, vocab, params, base)], scorer)[0]


# A search is a generator of scorer calls: it yields (phase, method, args) and is sent the answer,
# so search_rows can run the searches of a batch's rows in step and answer a step's calls of one
# kind together (Scorer.score_nodes_many, score_many: one forward for every row's round).
_Call = tuple[str, str, tuple]
_Search = Generator[_Call, Any, "Outcome"]

# The batched form of a scorer method, where the scorer has it: [args] -> [answer].
_MANY = {"score_nodes": "score_nodes_many", "score": "score_many", "score_branches": "score_branches_many"}


def _weight(method: str, args: tuple) -> float:
    """A call's share of a batched forward's cost: its nodes (score_nodes), else one."""
    return float(max(1, len(args[1]))) if method == "score_nodes" else 1.0


class _Driver:
    """Searches run in step: each step answers every waiting call once, those of a method with a
    batched form in one call, and charges each search its share of the cost (the scorer's forwards,
    tokens and seconds, by _weight) in its Outcome.phases. Searches join at any step and leave as
    they end (search_rows: the next batch's join while the last of this one's finish). A search's
    key orders its calls within a step."""

    def __init__(self, scorer: Scorer):
        self.scorer = scorer
        self.searches: dict[Any, _Search] = {}
        self.waiting: dict[Any, _Call] = {}
        self.phases: dict[Any, dict[str, list[float]]] = {}
        self.bases: dict[Any, set[tuple[int, ...]]] = {}      # the ids each search's calls named

    def add(self, key: Any, search: _Search) -> Outcome | None:
        """Start a search; its Outcome if it ended without a call."""
        self.searches[key], self.phases[key], self.bases[key] = search, {}, set()
        return self._send(key, None)

    def _send(self, key: Any, answer: Any) -> Outcome | None:
        try:
            call = self.searches[key].send(answer)
        except StopIteration as stop:
            out = stop.value
            for phase, acc in self.phases.pop(key).items():
                mine = out.phases.setdefault(phase, [0.0, 0.0, 0.0])
                for j in range(3):
                    mine[j] += acc[j]
            out.forwards = sum(v[0] for v in out.phases.values())
            out.tokens = sum(v[1] for v in out.phases.values())
            del self.searches[key]
            return out
        self.waiting[key] = call
        self.bases[key].add(tuple(call[2][0]))
        return None

    def step(self) -> dict[Any, Outcome]:
        """Answer every waiting call once; the Outcomes of the searches that ended."""
        step, self.waiting = self.waiting, {}
        by_method: dict[str, list[Any]] = {}
        for key in sorted(step):
            by_method.setdefault(step[key][1], []).append(key)
        answers: dict[Any, Any] = {}
        scorer = self.scorer
        for method, keys in by_method.items():
            many = getattr(scorer, _MANY.get(method, ""), None)
            c = scorer.counters
            f, t, s = c.forwards, c.tokens, time.perf_counter()
            if many is not None and len(keys) > 1:
                answers.update(zip(keys, many([step[k][2] for k in keys])))
            else:
                answers.update((k, getattr(scorer, method)(*step[k][2])) for k in keys)
            cost = (c.forwards - f, c.tokens - t, time.perf_counter() - s)
            weights = [_weight(method, step[k][2]) for k in keys]
            for k, w in zip(keys, weights):
                acc = self.phases[k].setdefault(step[k][0], [0.0, 0.0, 0.0])
                for j in range(3):
                    acc[j] += cost[j] * w / sum(weights)
        ended = {}
        for key in sorted(answers):
            out = self._send(key, answers[key])
            if out is not None:
                ended[key] = out
        return ended


def _drive(searches: Sequence[_Search], scorer: Scorer) -> list[Outcome]:
    """Run searches to their Outcomes, in step (_Driver)."""
    driver = _Driver(scorer)
    done: dict[int, Outcome] = {}
    for i, one in enumerate(searches):
        out = driver.add(i, one)
        if out is not None:
            done[i] = out
    while driver.waiting:
        done.update(driver.step())
    return [done[i] for i in range(len(searches))]


def _search(prompt: Sequence[int], completion: Sequence[int], target_len: int | None, vocab: Vocab,
            params: RepairParams, base: Scored | None = None) -> _Search:
    canon = list(completion)
    no_bill = target_len is None
    out = Outcome(ids=canon, status="kept", reason=None, no_bill=no_bill, target_len=target_len,
                  margin_runner_up=None, margin_canonical=None, confidence=None, confidence_hi=None, candidates=0, forwards=0,
                  tokens=0)
    prompt = list(prompt)
    ids, known = canon, {}
    if base is None:
        base = yield ("base", "score", (prompt + canon, len(prompt), alternatives(canon, vocab)))
    total_canon = ll = None
    for k in range(params.passes):
        r = yield from _pass(prompt, ids, base, target_len, vocab, params, known, k)
        out.candidates += r.candidates
        out.nodes += r.nodes
        out.passes = k + 1
        out.capped = out.capped or r.truncated
        if total_canon is None:
            total_canon = r.base_total
        if not r.ranked:
            if k == 0:
                out.reason = "budget" if r.truncated else "no_candidate"
                return out
            break                       # no admissible alternative to the base: it stands
        ll = r.ranked[0][0]
        out.margin_runner_up = ll - r.ranked[1][0] if len(r.ranked) > 1 else None
        if r.reach is not None:
            # Splits further back than r.reach were pruned: a runner-up past it reads as r.reach.
            out.margin_runner_up = min(r.reach, out.margin_runner_up if out.margin_runner_up is not None else math.inf)
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
    return out


# The next batch's base pass runs once this batch has no more than this many searches left, and its
# searches join their rounds: a round of a few rows pays a forward's fixed cost for few nodes (T 1.0
# code: 7.7 ms a node for one row, 4.9 for 4-7 rows, 4.1 for 8-15), and the last rows of a batch are
# the long searches, so alone they took ~2,000 of ~16,000 nodes in 146 one-row forwards.
OVERLAP_ROWS = 8


def search_rows(rows: Sequence[tuple[Sequence[int], Sequence[int], int | None]], scorer: Scorer, vocab: Vocab,
                params: RepairParams, prefill: Callable[[list[tuple[int, Any]]], None] | None = None
                ) -> Iterator[Outcome]:
    """`search` over many rows (prompt, completion, target_len), the first pass of each batched
    the way the hidden stage batches its forward (`Scorer.score_rows`: rows sorted by length,
    about params.batch_tokens padded tokens per pass). Outcomes come in the rows' order; the base
    pass's cost is spread over the batch's rows (phase `base`). A batch's searches run in step
    (_Driver), and the next batch's join them once OVERLAP_ROWS or fewer are left. `prefill`, once
    per batch before its caches are released: [(row index, the features the scorer captured in the
    base pass)] for the batch's rows whose search left their ids as they were (the hidden stage's
    prefill)."""
    rows = list(rows)
    order = sorted(range(len(rows)), key=lambda i: (-(len(rows[i][0]) + len(rows[i][1])), i))
    chunks: list[list[int]] = []
    k = 0
    while k < len(order):
        width = len(rows[order[k]][0]) + len(rows[order[k]][1])
        chunks.append(order[k:k + max(1, params.batch_tokens // max(1, width))])
        k += len(chunks[-1])
    rank = {i: r for r, i in enumerate(order)}       # a search's key: its calls go in this order
    same = [(tuple(p), tuple(c), n) for p, c, n in rows]
    driver = _Driver(scorer)
    live: dict[int, set[int]] = {}                  # batch -> the keys of its searches not ended
    batch: dict[int, tuple[list[int], list[float], dict, dict[int, Outcome], dict]] = {}
    of: dict[int, int] = {}                          # key -> its batch
    done: dict[int, Outcome] = {}

    def start(b: int) -> None:
        chunk = chunks[b]
        f0, t0, c0 = scorer.counters.forwards, scorer.counters.tokens, time.perf_counter()
        scored = scorer.score_rows([(list(rows[i][0]) + list(rows[i][1]), len(rows[i][0]),
                                     alternatives(rows[i][1], vocab)) for i in chunk])
        share = [(scorer.counters.forwards - f0) / len(chunk), (scorer.counters.tokens - t0) / len(chunk),
                 (time.perf_counter() - c0) / len(chunk)]
        # A row that repeats an earlier one of the batch (the same prompt, ids and bill) is searched once.
        first: dict[tuple, int] = {}
        for i in chunk:
            first.setdefault(same[i], i)
        outs: dict[int, Outcome] = {}
        # This pass's features, taken now: a later batch holding the same ids would replace them.
        features = {i: scorer.features(list(rows[i][0]) + list(rows[i][1])) for i in chunk} if prefill else {}
        live[b] = set()
        batch[b] = (chunk, share, first, outs, features)
        for i, sc in zip(chunk, scored):
            if first[same[i]] == i:
                of[rank[i]] = b
                out = driver.add(rank[i], _search(rows[i][0], rows[i][1], rows[i][2], vocab, params, base=sc))
                if out is None:
                    live[b].add(rank[i])
                else:
                    outs[i] = out

    def finish(b: int) -> None:
        chunk, share, first, outs, features = batch.pop(b)
        for i in chunk:
            j = first[same[i]]
            out = outs[i] if i == j else _repeat(outs[j])
            out.phases["base"] = list(share)
            out.forwards += share[0]
            out.tokens += share[1]
            done[i] = out
        if prefill is not None:
            prefill([(i, features[i]) for i in chunk if done[i].status != "repaired"])
        # The batch's caches go, but not one a batch still searching names (the same ids).
        mine = set().union(*(named(i) for i in chunk))
        for i in chunk:
            driver.bases.pop(rank[i], None)
        scorer.release(mine - set().union(*(named(i) for c in batch for i in batch[c][0])))

    def named(i: int) -> set[tuple[int, ...]]:
        # The bases row i's search asked the scorer about, its own first.
        return driver.bases.get(rank[i], set()) | {same[i][0] + same[i][1]}

    nxt = b = 0
    while b < len(chunks) or live:
        if b < len(chunks) and sum(len(v) for v in live.values()) <= OVERLAP_ROWS:
            start(b)
            b += 1
        else:
            for key, out in driver.step().items():
                live[of[key]].discard(key)
                batch[of[key]][3][order[key]] = out
        for c in [c for c, keys in live.items() if not keys]:
            del live[c]
            finish(c)
        while nxt in done:
            yield done.pop(nxt)
            nxt += 1
    scorer.release()


def _repeat(out: Outcome) -> Outcome:
    """The outcome of a row searched already in the same batch, for its twin: the same decision, no
    search cost of its own."""
    twin = copy.deepcopy(out)
    twin.phases, twin.forwards, twin.tokens = {}, 0.0, 0.0
    return twin


def alternatives(ids: Sequence[int], vocab: Vocab, start: int = 0) -> list[list[int]]:
    """Per position of ids from `start` on: the ordinary ids other than ids[t] whose bytes are a
    prefix of the text that remains from t within its text span (special positions have none)."""
    alts: list[list[int]] = [[] for _ in ids[start:]]
    for s, e in spans(ids, vocab):
        if e <= start:
            continue
        text = vocab.bytes_of(ids[s:e])
        o = 0
        for t in range(s, e):
            if t >= start:
                alts[t - start] = [a for a in vocab.prefixes(text, o) if a != ids[t]]
            o += len(vocab.pieces[ids[t]])
    return alts


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
    reach: float | None = None                         # windows were pruned this far back (nats)
    nodes: int = 0                                     # trie nodes scored


def _pass(prompt: list[int], canon: list[int], scored: Scored, target_len: int | None, vocab: Vocab,
          params: RepairParams, known: dict, number: int = 0) -> Generator[_Call, Any, _Pass]:
    """One pass around `canon` (the base: the canonical ids, or the previous pass's choice) whose
    scores are `scored`.

    Every alternative opens windows (no probability threshold: with a bill that asks for another
    length, the best window of that length change wins however unlikely it is next to the base).
    Each window has an UPPER BOUND on its delta: the log-probabilities of its branch tokens known so
    far (the first from the base pass, one more per trie node scored) minus the base's over the
    span and the re-join (the rest is <= 0). The search is branch and bound over those: the dynamic
    programme runs on exact deltas where known and bounds elsewhere; the nodes left on the paths of
    the windows that could win (the leader's, and those of splits within `decide` of it) are scored,
    with the next nodes of the windows of highest max-marginal, in one tree-masked forward; until
    the leader is the base or exact. So only windows that could win are scored: on exact rows, the
    few whose bound beats the base. (Filling the rounds by max-marginal rather than bare bound
    halved the windows scored on tests/test_repair_search.py's four rows for the same choices.)
    Where search_tokens runs out first, the pass is `truncated`. `number`: the pass's, from 0 (a
    name no loop below rebinds: `k` indexes windows)."""
    base = prompt + canon
    p0 = len(prompt)
    lp = [max(v, FLOOR) for v in scored.logprobs]
    la = params.rejoin_tokens
    want = None if target_len is None else target_len - len(canon)

    # Every window, as a path in a trie of branch tokens (its ids, then the re-join tokens), with
    # what is known of its delta: its first token's log-probability from the base pass, then one
    # more token per trie node scored; the rest is <= 0, so `part - ref` bounds the delta until
    # the last node is in, and is the delta after. Windows a previous pass scored (before its
    # first edit) keep their exact delta.
    windows: list[Window] = []
    branch: list[tuple[int, ...]] = []
    part: list[float] = []                    # log-probability of the branch tokens known so far
    # Tokens whose value in `part` is an engine's bound (below its top k: score.py `Bound`), by
    # their place in the branch, with what they added. A window is exact only once none is left: a
    # request that carries the token in its prompt returns its exact value (a PATH request; with
    # prompt log-probabilities, any node request past it).
    loose: dict[int, dict[int, float]] = {}
    ref: list[float] = []                     # the base's over the same span
    for s, e in spans(canon, vocab):
        text = vocab.bytes_of(canon[s:e])
        offs, o = {}, 0
        for t in range(s, e):
            offs[o] = t
            o += len(vocab.pieces[canon[t]])
        offs[o] = e
        inv = {v: k for k, v in offs.items()}
        memo: dict[int, list[int]] = {}
        for t in range(s, e):
            for a, v in scored.asked[t].items():
                if v == -math.inf:
                    continue                          # outside the nucleus: the sampler could not
                for w in _windows(text, offs, inv[t] + len(vocab.pieces[a]), [a], vocab, params, memo):
                    end = offs[inv[t] + sum(len(vocab.pieces[i]) for i in w)]
                    windows.append(Window(t, end, tuple(w)))
                    branch.append(tuple(w) + tuple(canon[end:end + la]))
                    if isinstance(v, Bound):
                        loose[len(part)] = {0: v}
                    part.append(v)
                    ref.append(sum(lp[t:min(len(canon), end + la)]))
    depth = [1] * len(windows)                 # branch tokens known
    value: dict[int, float] = {}              # index -> exact local delta; -inf: impossible
    # A request -> the windows waiting for it. A request is a trie node and what it is asked for:
    # NEXT, the tokens after it (all a search in process ever asks), or, for an engine's bounds
    # (score.py `Bound`), PATH: its path's exact values (a window whose every token is known, some
    # only as a bound).
    waiting: dict[tuple[tuple[int, tuple[int, ...]], str], list[int]] = {}
    # The windows by their trie root (start, first token): a node's children (the tokens asked after
    # it) are read from its root's windows when it is first asked for. Every node's set built up
    # front took ~3% of a T 1.0 search beyond its prefill (sampled by py-spy): ~1,400 windows a row
    # a pass, of which a few dozen nodes are ever asked for.
    rooted: dict[tuple[int, int], list[int]] = {}
    children: dict[tuple[int, tuple[int, ...]], list[int]] = {}    # trie node -> next tokens asked
    for k, w in enumerate(windows):
        d = known.get((w.start, w.end, w.ids))
        if d is not None:
            value[k] = d
            loose.pop(k, None)
        elif len(branch[k]) == 1 and k not in loose:
            value[k] = part[k] - ref[k]       # a one-token window at the row's end: nothing follows
        else:
            waiting.setdefault(((w.start, branch[k][:1]), PATH if len(branch[k]) == 1 else NEXT), []).append(k)
        rooted.setdefault((w.start, branch[k][0]), []).append(k)
    truncated = False
    candidates = 0                            # windows whose delta was scored here
    spent = 0                                 # trie nodes scored (one forwarded token each)

    def node_of(k: int) -> tuple[int, tuple[int, ...]]:
        return windows[k].start, branch[k][:depth[k]]

    got: dict[tuple[int, tuple[int, ...]], dict[int, float]] = {}     # trie node -> its scores
    paths: dict[tuple[int, tuple[int, ...]], list[float]] = {}        # trie node -> its path's exact values

    def after(n: tuple[int, tuple[int, ...]]) -> list[int]:
        if n not in children:
            at, path = n
            children[n] = sorted({branch[k][len(path)] for k in rooted[(at, path[0])]
                                  if len(branch[k]) > len(path) and branch[k][:len(path)] == path})
        return children[n]

    def score(reqs: list[tuple[tuple[int, tuple[int, ...]], str]], phase: str = "windows") -> Generator[_Call, Any, None]:
        # One call (one tree-masked forward in process) for the round's nodes; every window at a
        # node advances by the tokens scored for it, and waits at its next request or is done. A
        # PATH request asks for no token after its node.
        nonlocal candidates, spent
        asks = [after(n) if kind == NEXT else [] for n, kind in reqs]
        results = yield (phase, "score_nodes", (base, [(p0 + at, list(path), ask)
                                                       for ((at, path), _), ask in zip(reqs, asks)]))
        spent += len(reqs)
        for (n, kind), ask, lps in zip(reqs, asks, results):
            if kind == NEXT:
                got[n] = dict(zip(ask, lps))
            if (exact := getattr(lps, "path", None)) is not None:
                paths[n] = exact
            elif kind == PATH:
                raise ValueError("the scorer gave a bound (a token below its top k) but no path values when asked: an "
                                 "engine scorer must answer a node that asks nothing with score.NodeAnswer's path")
        for n, kind in reqs:
            for k in waiting.pop((n, kind), ()):
                advance(k)
            if kind == NEXT and n in paths:
                for k in waiting.pop((n, PATH), ()):
                    advance(k)

    def advance(k: int) -> None:
        nonlocal candidates
        while True:
            n = node_of(k)
            if k in loose and n in paths:
                # The request of this node carried the window's tokens up to here: their exact
                # values replace the bounds an engine's top k gave (score.py `Bound`).
                for j in [j for j in loose[k] if j < depth[k]]:
                    v = paths[n][j]
                    if j < len(windows[k].ids) and v == -math.inf:
                        value[k] = -math.inf          # below the top k, and outside the nucleus after all
                        candidates += 1
                        return
                    part[k] += (v if j == 0 else max(v, FLOOR)) - loose[k].pop(j)
                if not loose[k]:
                    del loose[k]
            if depth[k] == len(branch[k]):
                if k in loose:                         # every token known, some as bounds: ask for the path
                    waiting.setdefault((n, PATH), []).append(k)
                    return
                value[k] = part[k] - ref[k]
                candidates += 1
                return
            if n not in got:
                waiting.setdefault((n, NEXT), []).append(k)
                return
            v = got[n][branch[k][depth[k]]]
            if depth[k] < len(windows[k].ids) and v == -math.inf:
                value[k] = -math.inf          # a token of the window the sampler could not draw
                candidates += 1
                return
            if isinstance(v, Bound):
                loose.setdefault(k, {})[depth[k]] = max(v, FLOOR)
            part[k] += max(v, FLOOR)
            depth[k] += 1

    def request(k: int) -> tuple[tuple[int, tuple[int, ...]], str] | None:
        # What window k waits for: the tokens after its node, or (engines) its path's values.
        n = node_of(k)
        if depth[k] < len(branch[k]):
            return None if n in got else (n, NEXT)
        return (n, PATH) if k in loose and n not in paths else None

    # Windows that cannot sit in any split within `reach` nats of a split already known exactly
    # (their max-marginal, on bounds, is below it) leave the programmes of later rounds: they can
    # neither be a contender nor be scored for the confidence, and the rounds' programmes shrink
    # to the windows that matter (T 1.0 code: ~1,400 windows a row, a few dozen live). The mass
    # (below) still counts every window; a runner-up further back than `reach` is not told apart
    # (`_Pass.reach`: the margin is reported as at least it).
    reach = max(params.rescore_margin, params.confidence_nats) + PRUNE_SLACK
    active = set(range(len(windows)))

    def current() -> list[float]:
        # Exact where scored; unscored windows at their bound, or out of the running (-inf) once
        # the cap cut the search (the decision is then made among scored windows only).
        return [value.get(k, -math.inf if truncated else part[k] - ref[k]) if k in active else -math.inf
                for k in range(len(windows))]

    def prune(mm: list[float]) -> None:
        exact = [value.get(k, -math.inf) if k in active else -math.inf for k in range(len(windows))]
        floor = _best(len(canon), windows, exact, want, params.max_length_delta, 1)
        cut = floor[0][0] - reach if floor else -math.inf
        active.difference_update([k for k in list(active) if mm[k] < cut or mm[k] == -math.inf])

    def next_nodes(ks: Sequence[int], room: int, taken: list) -> list:
        # The requests the windows ks wait for, in order, until the round holds `room`.
        for k in ks:
            if len(taken) >= room:
                break
            if k not in value and (r := request(k)) is not None and r not in taken:
                taken.append(r)
        return taken

    # Only splits that could win, or be re-ranked exactly against the winner, need exact deltas:
    # the leader and those within `decide` of it. A leading base stands (every other split is below
    # it at its bound), with its rivals within rival_margin where asked. A runner-up further back
    # is ranked by its bound and never scored: the margin it gives errs low, and no decision reads
    # it (ambiguous_margin is inside `decide`).
    decide = max(params.rescore_margin, params.ambiguous_margin)

    def needed(top: list[tuple[float, tuple[int, ...]]]) -> list[int]:
        if not top:
            return []
        if not top[0][1]:
            # A leading base stands, but for its rivals within rival_margin where asked (0: none).
            rivals = params.rival_margin
            return [k for v, sol in top[1:] if rivals and v >= top[0][0] - rivals for k in sol if k not in value]
        return [k for v, sol in top if v >= top[0][0] - decide for k in sol if k not in value]

    while True:
        vals = current()
        top = _best(len(canon), windows, vals, want, params.max_length_delta, params.beam)
        best = _contenders(top, params.rescore_margin, params.rival_margin)
        need = needed(top)
        if not need:
            break
        room = params.search_tokens - spent
        if room <= 0:
            # Windows that could enter the contenders were left unscored: the row says so
            # (Outcome.capped, column repair_capped), and the confidence's low estimate still
            # counts them at their bound (below), so it keeps erring low.
            truncated = True
            best = _contenders(_best(len(canon), windows, current(), want, params.max_length_delta, params.beam),
                               params.rescore_margin, params.rival_margin)
            break
        # Each round takes the contenders' windows one node further, not whole: a window often
        # falls out at its second node, and with a batch's rows in step (_drive) a round's fixed
        # cost is shared, so the nodes are the cost (T 1.0 code: ~25% fewer, the same choices).
        taken = next_nodes(need, room, [])
        mm = _max_marginals(len(canon), windows, vals, want, params.max_length_delta)
        # The round's other slots go to the windows most likely to be asked for next: by their
        # max-marginal (the best split at the length that holds them, on current values), not
        # their bare bound, which ignores whether a split at the bill's length can hold them.
        # So the search_tokens cap is spent best-first, on windows that could still win.
        rest = sorted((k for k in active if k not in value and mm[k] > -math.inf), key=lambda k: (-mm[k], k))
        yield from score(next_nodes(rest, min(room, max(params.round_tokens, len(taken))), taken))
        prune(mm)
    # The decision is made; the rest only sharpens the confidence: unscored windows that could
    # sit in a split within confidence_nats of the best (by their bounds) are scored, so the mass
    # counts them at their value, not at a bound that is often nats too high. Scoring can only
    # lower a value, so the contenders stay as they are.
    # Only the row's last pass reports the confidence: the one whose base stands (after a first
    # pass that changed the ids), or the last allowed. A first pass whose base stands keeps the row
    # as the text method made it; its confidence is not sharpened (its low estimate counts the
    # unscored windows at their bound, so it errs lower), which makes such rows cost the base pass
    # alone where every other split is below the canonical encoding at its bound.
    leads = bool(best and best[0])
    final = (not leads and number > 0) or (leads and number == params.passes - 1)
    while final and params.confidence_nats > 0 and not truncated and spent < params.search_tokens:
        vals = current()
        top = _best(len(canon), windows, vals, want, params.max_length_delta, 1)
        if not top:
            break
        mm = _max_marginals(len(canon), windows, vals, want, params.max_length_delta)
        todo = sorted((k for k in active if k not in value and mm[k] >= top[0][0] - params.confidence_nats),
                      key=lambda k: (-mm[k], k))
        if not todo:
            break
        yield from score(next_nodes(todo, min(params.search_tokens - spent, params.round_tokens), []), "confidence")
        prune(mm)

    total = sum(lp)
    mass = _log_mass(len(canon), windows, [value.get(k, part[k] - ref[k]) for k in range(len(windows))], want,
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
    behind: list[tuple[float, tuple[Window, ...]]] = []     # ranked by local values, never first
    others = []                            # the runner-ups to re-score, in one call
    local = [sum(decided[i] for i in sol) for sol in picked]
    for k, edits in enumerate(sols):
        if not edits:
            ranked.append((total, edits))
        elif (not sols[0] and params.rival_margin and local[k] >= -params.rival_margin
              and all(i in value for i in picked[k])):
            # A rival of a leading base (rival_margin): its gain may lie downstream (T 1.0 code row
            # 34's ` RL|I` is 1.33 nats behind locally and 5.19 ahead over the row).
            others.append(edits)
        elif not sols[0] or local[k] < local[0] - decide:
            # The base won, or this split is too far behind the leader to win: it is not re-scored;
            # its margin is the local one (a bound where a delta was not scored).
            behind.append((total + local[k], edits))
        elif k:
            others.append(edits)
    # The model copies a split it made (untuned row 56 splits `read|er` three times): each edit's
    # local score is nats below the canonical one, and only the edits together, over the whole
    # row, show it. With `copy_splits`, the leader with one of its edits moved to another place
    # where the base has the same ids, or made at every such place, completed to the bill's
    # length by the best other windows, is re-scored beside the contenders whatever its local
    # score (the copy's gain lies downstream); one the beam ranked behind on its local sum is
    # re-scored instead. extra: a split outside the beam -> (its local sum at values or bounds,
    # the same over scored windows only), for the mass.
    extra: dict[tuple[Window, ...], tuple[float, float]] = {}
    if params.copy_splits and sols and sols[0]:
        loc = [value.get(k, part[k] - ref[k]) for k in range(len(windows))]
        rescoring = {sols[0], *others}
        for sol in _copies(canon, windows, loc, picked[0], want, params.max_length_delta):
            edits = tuple(windows[i] for i in sol)
            if edits and edits not in rescoring:
                rescoring.add(edits)
                others.append(edits)
                behind = [b for b in behind if b[1] != edits]
                if edits not in sols:
                    extra[edits] = (sum(loc[i] for i in sol), sum(value.get(i, -math.inf) for i in sol))
    if others:
        firsts = [edits[0].start for edits in others]
        tails = yield ("rescore", "score_branches", (base, [(p0 + f, _apply(canon, e)[f:]) for f, e in zip(firsts, others)]))
        ranked += [(sum(lp[:f]) + sum(max(v, FLOOR) for v in tail), e) for f, e, tail in zip(firsts, others, tails)]

    def rescored(edits: tuple[Window, ...], replace: list[int]) -> Generator[_Call, Any, tuple[list[int], Scored]]:
        # The split's exact scores, as the next pass's base: only from its first edit on. Before
        # it the ids, their context and the text left (so the alternatives) are the base's, and
        # so are the base pass's scores there (the head over those positions would repeat them).
        ids, f = _apply(canon, edits), edits[0].start
        tail = yield ("rescore", "score", (prompt + ids, p0 + f, alternatives(ids, vocab, f), replace))
        return ids, Scored(scored.logprobs[:f] + tail.logprobs, scored.asked[:f] + tail.asked)

    nxt, ids = None, canon
    if sols and sols[0]:
        ids, nxt = yield from rescored(sols[0], base)
        ranked.append((sum(max(v, FLOOR) for v in nxt.logprobs), sols[0]))
    ranked.sort(key=lambda x: -x[0])
    # The splits scored over the whole row count in the mass at that value, not at the sum of
    # their windows' local deltas: the confidence's numerator is the winner's exact likelihood, so
    # its denominator counts the winner, and each contender re-scored beside it, the same way. (A
    # split whose windows win locally and lose downstream otherwise keeps its local weight, and the
    # exact split that beat it reads as unlikely.)
    local_of = {tuple(windows[i] for i in sol): loc for sol, loc in zip(picked, local)}
    swaps = [(v - total, local_of[edits]) for v, edits in ranked if edits and edits in local_of]
    swaps_scored = swaps + [(v - total, extra[edits][1]) for v, edits in ranked if edits in extra]
    swaps += [(v - total, extra[edits][0]) for v, edits in ranked if edits in extra]
    mass, mass_scored = _swap_terms(mass, swaps), _swap_terms(mass_scored, swaps_scored)
    ranked = ranked[:1] + sorted(ranked[1:] + behind, key=lambda x: -x[0])
    out = _Pass(total, mass, mass_scored, ranked, candidates, truncated)
    out.reach = reach if len(active) < len(windows) else None
    out.nodes = spent
    if ranked and ranked[0][1]:
        win = ranked[0][1]
        out.next_ids = _apply(canon, win)
        if win is sols[0]:
            out.next_base = nxt
        else:
            # The exact re-score reversed the local order: the runner-up wins; score it as a base.
            _, out.next_base = yield from rescored(win, prompt + ids)
        first = win[0].start
        out.carry = {(w.start, w.end, w.ids): value[k] for k, w in enumerate(windows)
                     if k in value and w.end + la <= first}
    return out


# A forced window's value in `_copies`' programme: above any split's sum, so every set the
# programme keeps holds the forced windows where they fit.
FORCED = 1.0e6


def _copies(canon: Sequence[int], windows: Sequence[Window], value: Sequence[float], leader: Sequence[int],
            want: int | None, max_delta: int) -> list[tuple[int, ...]]:
    """Splits that repeat one of the leader's edits elsewhere (window indices): the edit moved to
    another place where the base has the same ids, or made at every such place; the rest of the
    split is the best the programme finds at the bill's length with those windows forced in (a
    forced set that no split at the length holds gives nothing)."""
    where = {(w.start, w.end, w.ids): k for k, w in enumerate(windows)}
    out = []
    for k in leader:
        w = windows[k]
        span = list(canon[w.start:w.end])
        n = len(span)
        at = [q for q in range(len(canon) - n + 1) if q != w.start and list(canon[q:q + n]) == span]
        same = [j for q in at if (j := where.get((q, q + n, w.ids))) is not None and value[j] > -math.inf]
        if not same:
            continue
        tries = [([j], k) for j in same] + [(same + [k], None)]
        for forced, drop in tries:
            v = list(value)
            for j in forced:
                v[j] = FORCED
            if drop is not None:
                v[drop] = -math.inf
            top = _best(len(canon), windows, v, want, max_delta, 1)
            if top and all(j in top[0][1] for j in forced):
                out.append(top[0][1])
    return out


def _swap_terms(log_mass: float, swaps: Sequence[tuple[float, float]]) -> float:
    """`log_mass` with each split's term exp(local) replaced by exp(exact) (swaps: (exact, local),
    logs relative to the base). Rounding cannot take the rest below zero: it is at least the
    exact terms."""
    if not swaps or log_mass == -math.inf:
        return log_mass
    top = max(log_mass, *(e for e, _ in swaps), *(loc for _, loc in swaps))
    rest = math.exp(log_mass - top) - sum(math.exp(loc - top) for _, loc in swaps)
    exact = sum(math.exp(e - top) for e, _ in swaps)
    return top + math.log(max(rest, 0.0) + exact)


def _edits(canon: Sequence[int], ids: Sequence[int]) -> list[Window]:
    """The changed span as one window (prefix and suffix in common cut), for the record."""
    from draftgate.reconstruct.classify import differing_span, first_difference

    i = first_difference(canon, ids)
    a, b = differing_span(canon, ids, i)
    return [Window(i, i + a, tuple(ids[i:i + b]))]


def decodes_to(ids: Sequence[int], text: bytes, vocab: Vocab) -> bool:
    return vocab.bytes_of(ids) == text


def _windows(text: bytes, offs: dict[int, int], at: int, path: list[int], vocab: Vocab,
             params: RepairParams, memo: dict[int, list[int]]) -> Iterator[list[int]]:
    """Continuations of `path` (which ends at byte `at`) up to the first canonical boundary.
    `memo`: the span's vocabulary prefixes by byte offset, shared by every walk over the span."""
    count = 0

    def walk(at: int, path: list[int]) -> Iterator[list[int]]:
        nonlocal count
        if at in offs:
            count += 1
            yield list(path)
            return
        if len(path) >= params.window_tokens:
            return
        if at not in memo:
            memo[at] = list(vocab.prefixes(text, at))
        for i in memo[at]:
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


def _contenders(best: list[tuple[float, tuple[int, ...]]], margin: float, rivals: float = 0.0
                ) -> list[tuple[int, ...]]:
    """The solutions the pass ranks exactly: the best two and every other within `margin` nats of
    the best, so near-ties are settled by exact re-scoring (the local order of three splits 0.1
    nat apart is noise: demo row `])|)))` vs `])))|)`). Where the base leads, it stands (every
    other is below it even at its bound): the base and the runner-up, for the margin, and the
    splits within `rivals` nats of it (rival_margin; 0: none)."""
    if best and not best[0][1]:
        return [sol for k, (v, sol) in enumerate(best) if k < 2 or (rivals and v >= best[0][0] - rivals)]
    return [sol for k, (v, sol) in enumerate(best) if k < 2 or v >= best[0][0] - margin]


def _shapes(windows: Sequence[Window], by_start: dict[int, list[int]]) -> dict[int, list[tuple[int, int, list[int]]]]:
    """The possible windows at each start grouped by shape: (end, length change, [indices]). The
    programmes treat the windows of a shape alike (the same span, the same change of length), so
    their states step over shapes, not windows: a T 1.0 code row's ~1,000 possible windows are
    ~200 shapes."""
    out: dict[int, list[tuple[int, int, list[int]]]] = {}
    for i, ks in by_start.items():
        groups: dict[tuple[int, int], list[int]] = {}
        for k in ks:
            groups.setdefault((windows[k].end, windows[k].length_change), []).append(k)
        out[i] = [(end, lc, members) for (end, lc), members in groups.items()]
    return out


def _events(n: int, shapes: dict[int, list[tuple[int, int, list[int]]]]) -> list[int]:
    """The positions where a programme's states can change: 0, n, and the possible windows' starts
    and ends. Between two of them the states only carry over, so the programmes step from one to
    the next (a row's 130 positions against the few dozen its live windows touch)."""
    pts = {0, n}
    for i, group in shapes.items():
        pts.add(i)
        pts.update(end for end, _, _ in group)
    return sorted(pts)


def _reach(events: Sequence[int], shapes: dict[int, list[tuple[int, int, list[int]]]]) -> dict[int, tuple[int, int]]:
    """Per event position i: the least and the most total length change the windows from i on can
    still add (ignoring overlaps, so a superset). A programme state at i whose change d cannot
    reach the bill (want - d outside that range) can never end at it: the programmes drop it,
    which changes no answer and spares most of their work on rows whose bill is near the base."""
    out: dict[int, tuple[int, int]] = {}
    lo = hi = 0
    for i in reversed(events):
        for end, lc, _ in shapes.get(i, ()):
            a, b = out[end]
            lo, hi = min(lo, a + lc), max(hi, b + lc)
        out[i] = (lo, hi)
    return out


def _best(n: int, windows: Sequence[Window], value: Sequence[float], want: int | None,
          max_delta: int, keep: int = 2) -> list[tuple[float, tuple[int, ...]]]:
    """The `keep` best sets of disjoint windows (score, indices): total length change == want
    (None: any), by total value. The empty set (the base) competes where its length is
    admissible; windows valued -inf are out. Keeping the `keep` best per state is exact for the
    `keep` best overall (each extends a state's best)."""
    by_start = _by_start(windows, value)
    shapes = _shapes(windows, by_start)
    # A set among the `keep` best that holds a window outside its shape's `keep` best would be
    # beaten by each of those in its place: such windows are out (T 1.0 code: most of them).
    out = set()
    for group in shapes.values():
        for _, _, members in group:
            if len(members) > keep:
                out.update(sorted(members, key=lambda k: (-value[k], k))[keep:])
    # states[i]: length change -> up to `keep` (score, window indices) reaching position i.
    states: dict[int, dict[int, list[tuple[float, tuple[int, ...]]]]] = {}

    def offer(at: dict, d: int, score: float, sol: tuple[int, ...]) -> None:
        # Keep the `keep` best, best first; an equal score keeps the one offered first.
        cur = at.get(d)
        if cur is None:
            at[d] = [(score, sol)]
        elif len(cur) < keep or score > cur[-1][0]:
            j = len(cur)
            while j and cur[j - 1][0] < score:
                j -= 1
            cur.insert(j, (score, sol))
            if len(cur) > keep:
                cur.pop()

    carry: dict[int, list[tuple[float, tuple[int, ...]]]] = {0: [(0.0, ())]}
    events = _events(n, shapes)
    reach = _reach(events, shapes) if want is not None else None
    for i in events:
        here = states.pop(i, None)
        if here is None:
            here = carry                 # nothing ends here: the states carry over as they are
        else:
            # What arrives here, then what carries over: a stable sort keeps the first offered of
            # equal scores, as offer does (the states are never changed once past).
            for d, entries in carry.items():
                cur = here.get(d)
                here[d] = list(entries) if cur is None else sorted(cur + entries, key=lambda e: -e[0])[:keep]
        for k in by_start.get(i, ()):
            if k in out:
                continue
            w, v = windows[k], value[k]
            to = states.setdefault(w.end, {})
            lc = w.length_change
            lo, hi = reach[w.end] if reach is not None else (-2 * max_delta, 2 * max_delta)
            for d, entries in here.items():
                e = d + lc
                if -max_delta <= e <= max_delta and (reach is None or lo <= want - e <= hi):
                    for score, sol in entries:
                        offer(to, e, score + v, sol + (k,))
        carry = here
    pool = carry.get(want, []) if want is not None else [e for es in carry.values() for e in es]
    return sorted(pool, key=lambda x: -x[0])[:keep]


def _max_marginals(n: int, windows: Sequence[Window], value: Sequence[float], want: int | None,
                   max_delta: int) -> list[float]:
    """Per window: the best score of a set of disjoint windows at the length that holds it (-inf:
    none), by a forward programme (best to each position and length change) and a backward one
    (best from each position for each change still to make)."""
    by_start = _by_start(windows, value)
    shapes = _shapes(windows, by_start)
    # A programme in (max, +) meets a shape's windows only through the best of them.
    top = {(i, end, lc): max(value[k] for k in members) for i, group in shapes.items() for end, lc, members in group}
    events = _events(n, shapes)
    reach = _reach(events, shapes) if want is not None else None
    fwd: dict[int, dict[int, float]] = {}
    arriving: dict[int, dict[int, float]] = {}
    carry: dict[int, float] = {0: 0.0}
    for i in events:
        here = arriving.pop(i, {})
        for d, v in carry.items():
            if v > here.get(d, -math.inf):
                here[d] = v
        fwd[i] = here
        for end, lc, _ in shapes.get(i, ()):
            vk = top[i, end, lc]
            to = arriving.setdefault(end, {})
            lo, hi = reach[end] if reach is not None else (0, 0)
            for d, v in here.items():
                e = d + lc
                if abs(e) <= max_delta and (reach is None or lo <= want - e <= hi) and v + vk > to.get(e, -math.inf):
                    to[e] = v + vk
        carry = here
    bwd: dict[int, dict[int, float]] = {}
    carry = {0: 0.0}
    for i in reversed(events):
        cur = dict(carry)
        for end, lc, _ in shapes.get(i, ()):
            vk = top[i, end, lc]
            for r, v in bwd[end].items():
                c = r + lc
                if abs(c) <= 2 * max_delta and v + vk > cur.get(c, -math.inf):
                    cur[c] = v + vk
        bwd[i] = carry = cur
    out = [-math.inf] * len(windows)
    for ks in by_start.values():                 # the possible windows only
        for k in ks:
            w, vk, best = windows[k], value[k], -math.inf
            rest = bwd[w.end]
            if want is None:
                tail = max(rest.values(), default=-math.inf)
                for v in fwd[w.start].values():
                    best = max(best, v + vk + tail)
            else:
                need = want - w.length_change
                for d, v in fwd[w.start].items():
                    tail = rest.get(need - d)
                    if tail is not None:
                        best = max(best, v + vk + tail)
            out[k] = best
    return out


def _log_mass(n: int, windows: Sequence[Window], value: Sequence[float], want: int | None,
              max_delta: int) -> float:
    """log of the summed likelihood (relative to the base) of every set of disjoint windows whose
    length change is want (None: any): `_best`'s programme with (logsumexp, +) for (max, +).

    The denominator of a choice's posterior. Windows not scored count at their upper bound, so
    the mass is over-counted and the posterior it gives errs low; window interactions are
    ignored (local deltas), as in the search itself."""
    by_start = _by_start(windows, value)
    states: dict[int, dict[int, float]] = {}

    def add(at: dict, d: int, v: float) -> None:
        if abs(d) <= max_delta:
            cur = at.get(d)
            at[d] = v if cur is None else max(cur, v) + math.log1p(math.exp(-abs(cur - v)))

    carry: dict[int, float] = {0: 0.0}
    shapes = _shapes(windows, by_start)
    events = _events(n, shapes)
    reach = _reach(events, shapes) if want is not None else None
    for i in events:
        here = states.pop(i, None)
        if here is None:
            here = carry                 # nothing ends here: the states carry over as they are
        else:
            for d, v in carry.items():
                add(here, d, v)
        for k in by_start.get(i, ()):
            w = windows[k]
            to = states.setdefault(w.end, {})
            lo, hi = reach[w.end] if reach is not None else (0, 0)
            for d, v in here.items():
                e = d + w.length_change
                if reach is None or lo <= want - e <= hi:
                    add(to, e, v + value[k])
        carry = here
    if want is not None:
        return carry.get(want, -math.inf)
    top = max(carry.values())
    return top + math.log(sum(math.exp(v - top) for v in carry.values()))
