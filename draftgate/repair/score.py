"""Per-token log-probabilities under the target, at the sampling settings the row was drawn with.

The quantity the search ranks tokenizations by is log p(ids | prompt) where each step's
distribution is the one the sampler drew from: logits / temperature, then top-k, then top-p (the
smallest set of the most likely tokens whose mass reaches top_p; the local server's rule,
serve/model.py `_pick`), renormalised. A token outside that set could not have been sampled:
its log-probability is -inf. Temperature 0 (greedy) keeps the argmax only.

A backend answers two questions (`Scorer`):
- `score(ids, start, ask)`: the tempered log-probability of each of ids[start:] given what
  precedes it, and of the `ask[k]` ids at position start + k (the alternatives the search may
  branch into), from one pass;
- `score_branches(base, branches)`: for each (at, ids), the same for ids continuing base[:at].
- `score_nodes(base, nodes)`: for each (at, path, ask), the tempered log-probabilities of the ask
  ids as the token after base[:at] + path: one node of the search's trie of windows, scored once
  for every window that runs through it. The HF target keeps each path's KV in the cache while the
  base stands, so a node costs one forwarded token however many windows share it.
- `score_nodes_many(asks)` and `score_many(asks)`: the same for several rows at once (the searches
  of a base-pass batch run in step, search.py `_drive`), and `score_branches_many` where a backend
  has it: the HF target answers each in one forward for every row (a forward's fixed cost, ~45 ms
  on this CPU, once per round, not per row), unpadded where it can run the decoder by its parts
  (HFScorer._flat); the HTTP backends send every row's requests together.
  Branches share the base's prefix, so a backend scores that prefix once: the HF target keeps the
  base's KV cache and scores every branch in one forward with a tree mask; an engine reuses its
  prefix cache (SGLang's radix cache; vLLM skips its prefix cache for requests that ask for
  prompt logprobs, so there a branch is a full prefill unless VllmScorer's `cached_nodes` sends
  it as a generation request).

What engines return (checked against their sources, 2026-12):
- vLLM `/v1/completions` with a token-id `prompt` and `prompt_logprobs: k`: `choices[0].
  prompt_logprobs` is a list as long as the prompt, None first, then per position a dict
  {token id (a string in JSON): {logprob, rank, decoded_token}} holding the prompt's own token
  (with its rank in the full vocabulary) and the top k (vllm/entrypoints/openai/protocol.py,
  CompletionResponseChoice.prompt_logprobs). They come from the RAW logits: no temperature, no
  top-p (vllm/v1/worker/gpu_model_runner.py `_get_prompt_logprobs_dict`; projects that need
  tempered prompt logprobs patch it, e.g. trinity's vllm_patch). vLLM needs max_tokens >= 1 unless
  `echo` is set with max_tokens 0; we ask for 1 generated token and ignore it.
- SGLang `/generate` with `input_ids`, `return_logprob: true`, `logprob_start_len: s`,
  `top_logprobs_num: k`, `return_text_in_logprobs: false`, `sampling_params.max_new_tokens: 0`:
  `meta_info.input_token_logprobs` is a list of [logprob, token id, text|None] for positions
  s..n-1 (the input's first token has logprob None), `meta_info.input_top_logprobs` the top k
  per position as lists of the same triples (python/sglang/srt/managers/tokenizer_manager.py,
  `detokenize_logprob_tokens`). Also raw by default (Req.temp_scaled_logprobs = False in
  schedule_batch.py); field names have moved between releases, so every answer is checked: the
  token id each entry names must be the id we sent at that position.

Tempering from top-k raw log-probabilities (HTTP backends) is an approximation, exact when the
top k hold all the mass: log p_T(x) = lp(x)/T - log Z_T with Z_T = sum over the top k of
exp(lp/T) plus the tail. The tail (raw mass R = 1 - sum of the top k) is counted as if each tail
token had the k-th raw probability p_k: R * p_k^(1/T - 1), an upper bound on the tail's tempered
mass for T < 1 and a lower bound for T > 1. The nucleus: a token in the top k is inside when the
tempered mass of the tokens above it is below top_p; a token below the top k is outside when the
top k's tempered mass already reaches top_p, else taken as inside (unknowable from the answer).
The in-process backend has the full distribution and needs none of this.

A token below the top k is at most as likely as the k-th: the HTTP backends give it that value as
a `Bound` (a float known only from above; -inf where the nucleus or top-k rules it out), so the
search can branch to it, and learn its value exactly from a request that carries it in its
prompt: the engine returns every prompt token's own log-probability whatever its rank, so a trie
node's answer with prompt log-probabilities (`NodeAnswer.path`) holds the exact values of the
node's own path tokens. Before, such a token read
as impossible, and through vLLM's top 20 the search missed splits whose first token ranks lower
(docs/repair.md, "Measured through vLLM").
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence

NEG_INF = float("-inf")
HEAD_ROWS = 256          # positions per LM-head chunk (HFScorer._logprobs)


class ScoreError(ValueError):
    """A backend that cannot score, or answered in a shape we do not understand."""


@dataclass(frozen=True)
class Sampling:
    """The sampler's settings the row was drawn with (generate's request)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                   # 0 = off

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ScoreError(f"sampling {self}: needs temperature >= 0, 0 < top_p <= 1, top_k >= 0")


@dataclass(frozen=True)
class Scored:
    logprobs: list[float]            # ids[start:], tempered, -inf outside the nucleus
    asked: list[dict[int, float]]    # per position: the asked ids' tempered log-probabilities


@dataclass
class Counters:
    forwards: int = 0                # model passes (HF) or requests (HTTP)
    tokens: int = 0                  # tokens the model computed (HF) or sent for scoring (HTTP)


class Scorer(Protocol):
    sampling: Sampling
    counters: Counters

    def score(self, ids: Sequence[int], start: int, ask: Sequence[Sequence[int]] | None = None,
              replace: Sequence[int] | None = None) -> Scored: ...

    def score_many(self, asks: Sequence[tuple[Sequence[int], int, Sequence[Sequence[int]] | None,
                                              Sequence[int] | None]]) -> list[Scored]: ...

    def score_branches(self, base: Sequence[int], branches: Sequence[tuple[int, Sequence[int]]]) -> list[list[float]]: ...

    def score_nodes(self, base: Sequence[int], nodes: Sequence[tuple[int, Sequence[int], Sequence[int]]]
                    ) -> list[list[float]]: ...

    def score_nodes_many(self, asks: Sequence[tuple[Sequence[int], Sequence[tuple[int, Sequence[int], Sequence[int]]]]]
                         ) -> list[list[list[float]]]: ...

    def score_rows(self, rows: Sequence[tuple[Sequence[int], int, Sequence[Sequence[int]] | None]]) -> list[Scored]: ...

    def features(self, ids: Sequence[int]) -> tuple[Any, Any] | None: ...

    def release(self, keys: Iterable[tuple[int, ...]] | None = None) -> None: ...


# ---------------------------------------------------------------- exact (full distribution)

def tempered_logprobs(logits: Any, sampling: Sampling) -> Any:
    """[n, V] logits -> [n, V] log-probabilities of the sampler's distribution (-inf outside)."""
    import torch

    logits = logits.float()
    if sampling.temperature == 0:
        out = torch.full_like(logits, NEG_INF)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 0.0)
        return out
    lp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p >= 1 and not sampling.top_k:
        return lp
    sorted_lp, order = lp.sort(dim=-1, descending=True)
    p = sorted_lp.exp()
    keep = (p.cumsum(-1) - p) < sampling.top_p           # mass before the token below top_p
    if sampling.top_k:
        keep[:, sampling.top_k:] = False
    keep[:, 0] = True
    sorted_lp = torch.where(keep, sorted_lp, torch.full_like(sorted_lp, NEG_INF))
    sorted_lp = sorted_lp - torch.logsumexp(sorted_lp, dim=-1, keepdim=True)
    return torch.full_like(lp, NEG_INF).scatter(-1, order, sorted_lp)


def picked_logprobs(logits: Any, sampling: Sampling, picks: Sequence[Sequence[int]]) -> list[list[float]]:
    """Per row of [n, V] logits: the sampler's log-probabilities of the ids picks[row], nothing else.

    A plain sampler (no top-p, no top-k) needs only each row's normaliser: x - logsumexp(x) at the
    picked ids, without writing the [n, V] log-probabilities (log_softmax), so a trie node's head
    costs its matmul and one reduction (on this CPU ~0.15 ms less per position). A truncating
    sampler needs the sorted distribution: tempered_logprobs, then the same picks."""
    import torch

    width = max((len(p) for p in picks), default=0)
    if not width:
        return [[] for _ in picks]
    index = torch.zeros((len(picks), width), dtype=torch.long)
    for k, p in enumerate(picks):
        if p:
            index[k, :len(p)] = torch.tensor(list(p), dtype=torch.long)
    index = index.to(logits.device)
    if sampling.temperature > 0 and sampling.top_p >= 1 and not sampling.top_k:
        x = logits.float()
        if sampling.temperature != 1:
            x = x / sampling.temperature
        got = x.gather(-1, index) - torch.logsumexp(x, dim=-1, keepdim=True)
    else:
        got = tempered_logprobs(logits, sampling).gather(-1, index)
    rows = got.tolist()
    return [r[:len(p)] for r, p in zip(rows, picks)]


class HFScorer:
    """The HF target in process (draftgate/target.py's Target.model, or serve/model.py's LocalModel.model).

    `score` runs the decoder once over ids, keeps its KV cache and its last hidden states (n x H:
    small, unlike logits over the vocabulary), and applies the LM head only where it is needed.
    `score_branches` on the same base scores every branch in ONE further pass over the branch
    tokens only: each attends to the cached base[:at] and to the earlier tokens of its own branch
    (a custom 4D mask, which transformers passes through unchanged: masking_utils, "If the mask is
    already 4D"); the cache is cropped back to the base afterwards (DynamicCache.crop). Llama-family
    heads (logits = lm_head(decoder output)); a head with soft-capping would need it applied here.

    Several bases are cached at once, by their ids (`_Row`: cache, states, trie), so the searches
    of a batch's rows run in step: `score_nodes_many` forwards every row's new nodes together, each
    under its own tree mask and appended to its own cache; `score_many` does the same for the rows'
    next bases (each from where it leaves its old base), `score_branches_many` for their runner-ups.
    Where the decoder is Llama-shaped (`_flat_decoder`: Llama, Qwen2, Qwen3), that forward runs
    by the decoder's parts, unpadded (`_flat`): the rows' tokens end to end through the
    projections and the MLP, the attention row by row on each row's own cache. Any other decoder
    takes a right-padded batch through its own forward, the rows' caches copied into it, a row
    padded only to rows of about its own size (PAD_SLACK): padding is computed like any token.

    `capture` = (layers, dtype name): `score_rows` also keeps each row's EAGLE-3 features from the
    same forward (draftgate/target.py `capturing`, the hidden stage's definition) until `release`,
    for the hidden stage's prefill (`features`; docs/repair.md, "One prefill for two stages").
    """

    def __init__(self, model: Any, sampling: Sampling, branch_tokens: int = 1024,
                 capture: tuple[Sequence[int], str] | None = None):
        self.model, self.sampling, self.branch_tokens, self.capture = model, sampling, branch_tokens, capture
        self.counters = Counters()
        self._features: dict[tuple[int, ...], tuple[Any, Any]] = {}      # score_rows' rows, with capture
        self._pending: dict[tuple[int, ...], tuple[Any, int, Any]] = {}  # score_rows: ids -> batch cache, row, states
        # The cached bases, by their ids: a search over many rows in step (search_rows) keeps one per
        # row, each with its own cache and score_nodes' trie. `_last`: the base `score` cuts back
        # from when it is not told which (one search at a time).
        self._rows: dict[tuple[int, ...], _Row] = {}
        self._last: tuple[int, ...] | None = None
        # Whether the forwards on cached rows run unpadded, by the decoder's parts (_flat); else a
        # padded batch through the model's own forward.
        self.flat = _flat_decoder(model) is not None

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def _logprobs(self, hidden: Any, targets: Sequence[int], ask: Sequence[Sequence[int]] | None = None
                  ) -> tuple[list[float], list[dict[int, float]]]:
        """The head and the sampler's distribution, HEAD_ROWS positions at a time: a batch's
        [positions, vocabulary] logits at once (5,500 x 49,152 floats, 1 GB, on a demo batch)
        made the batched base pass 2.6x the hidden stage's forward instead of ~1.3x."""
        head = self.model.get_output_embeddings()
        targets = list(targets)
        ask = list(ask) if ask is not None else [()] * len(targets)
        mine: list[float] = []
        asked: list[dict[int, float]] = []
        for a in range(0, len(targets), HEAD_ROWS):
            wants = ask[a:a + HEAD_ROWS]
            got = picked_logprobs(head(hidden[a:a + HEAD_ROWS]), self.sampling,
                                  [[t, *want] for t, want in zip(targets[a:a + HEAD_ROWS], wants)])
            mine += [g[0] for g in got]
            asked += [{int(i): float(v) for i, v in zip(want, g[1:])} if want else {} for want, g in zip(wants, got)]
        return mine, asked

    def score(self, ids: Sequence[int], start: int, ask: Sequence[Sequence[int]] | None = None,
              replace: Sequence[int] | None = None) -> Scored:
        """One pass over ids. Where a cached base shares a prefix with ids (the search's next base
        differs from the last one only from its first edit on), that prefix of its cache is reused
        and only the rest is computed. `replace`: that base (by default the last one used); it
        stays cached as it was, for any other search on the same ids."""
        return self.score_many([(ids, start, ask, replace)])[0]

    def score_many(self, asks: Sequence[tuple[Sequence[int], int, Sequence[Sequence[int]] | None,
                                              Sequence[int] | None]]) -> list[Scored]:
        """`score` of several (ids, start, ask, replace), other rows' next bases: the part each must
        compute (from where it leaves the base it replaces) in ONE forward (_extend), so the weights
        are read once for every row of a search_rows batch that re-scores in the same step."""
        import torch

        jobs = []
        for ids, start, ask, replace in asks:
            ids = list(ids)
            if not 1 <= start <= len(ids):
                raise ScoreError(f"start {start} must be in 1..{len(ids)} (the first token has no context)")
            key = tuple(ids)
            self._adopt(key)
            if replace is not None:
                self._adopt(tuple(replace))
            src = key if key in self._rows else (tuple(replace) if replace is not None else self._last)
            row = self._rows.get(src) if src is not None else None
            common = 0
            if row is not None:
                while common < min(len(row.ids), len(ids)) and row.ids[common] == ids[common]:
                    common += 1
                common = min(common, len(ids) - 1)        # at least one token runs, for its state
            jobs.append((ids, start, ask, row, common))
        outs: list[Scored] = []
        with torch.inference_mode():
            todo = sorted(range(len(jobs)), key=lambda j: -(len(jobs[j][0]) - jobs[j][4]))
            states: list[Any] = [None] * len(jobs)
            while todo:
                group = [todo[0]]
                size = len(jobs[todo[0]][0]) - jobs[todo[0]][4]
                for j in todo[1:]:
                    new = len(jobs[j][0]) - jobs[j][4]
                    if self._joins(len(group), len(jobs[group[0]][0]) - jobs[group[0]][4], size, new):
                        group.append(j)
                        size += new
                for j, h in zip(group, self._extend([(jobs[j][0], jobs[j][3], jobs[j][4]) for j in group])):
                    states[j] = h
                todo = [j for j in todo if j not in group]
            for (ids, start, ask, _, _), h in zip(jobs, states):
                mine, asked = self._logprobs(h[start - 1:len(ids) - 1], ids[start:], ask)
                outs.append(Scored(mine, asked))
        if jobs:
            self._last = tuple(jobs[-1][0])
        return outs

    def _extend(self, jobs: Sequence[tuple[list[int], _Row | None, int]]) -> list[Any]:
        """For each (ids, cached row, common): a new cached row for ids whose cache is a copy of the
        old one's first `common` columns (none without a row) followed by ids[common:], computed in
        one forward: unpadded (_flat), or right-padded, row r's new tokens after the widest prefix
        seeing its own prefix and its own earlier new tokens (a 4D mask). The old rows stay as
        they were (their trie columns after the base are never copied). Returns each row's hidden
        states over ids."""
        import torch
        from transformers.cache_utils import DynamicCache

        dev, dtype = self.device, next(self.model.parameters()).dtype
        commons = [common if row is not None else 0 for _, row, common in jobs]
        if self.flat:
            # Each row's new cache: a copy of its prefix with room for the rest, which one unpadded
            # forward of every row appends (_flat).
            pieces = []
            for (ids, row, _), c in zip(jobs, commons):
                k = len(ids) - c
                cache = (_stack([row.cache], [c], c, self.model.config, k + ROW_ROOM) if c
                         else DynamicCache(config=self.model.config))
                allow = torch.cat([torch.ones((k, c), dtype=torch.bool),
                                   torch.ones((k, k), dtype=torch.bool).tril()], 1)
                pieces.append((cache, ids[c:], range(c, len(ids)), allow))
            out = []
            for (ids, row, _), c, (cache, _, _, _), h_new in zip(jobs, commons, pieces, self._flat(pieces)):
                h = torch.cat([row.h[:c], h_new]) if c else h_new
                self._rows[tuple(ids)] = _Row(tuple(ids), cache, h)
                out.append(h)
            return out
        if len(jobs) == 1:
            # One row: a plain causal forward on a copy of its prefix, no mask, as a row alone has
            # always been scored (the same kernels as the base pass and the hidden stage).
            (ids, row, _), c = jobs[0], commons[0]
            cache = (_stack([row.cache], [c], c, self.model.config, len(ids) - c + ROW_ROOM) if c
                     else DynamicCache(config=self.model.config))
            h_new = self.model.get_decoder()(input_ids=torch.tensor([ids[c:]], dtype=torch.long, device=dev),
                                             position_ids=torch.arange(c, len(ids), device=dev)[None],
                                             cache=cache, use_cache=True).last_hidden_state[0]
            h = torch.cat([row.h[:c], h_new]) if c else h_new
            self.counters.forwards += 1
            self.counters.tokens += len(ids) - c
            self._rows[tuple(ids)] = _Row(tuple(ids), cache, h)
            return [h]
        width = max(commons)
        m = max(len(ids) - c for (ids, _, _), c in zip(jobs, commons))
        batch = _stack([row.cache if row is not None else None for _, row, _ in jobs], commons, width,
                       self.model.config, m)
        allow = torch.zeros((len(jobs), m, width + m), dtype=torch.bool)
        x = torch.zeros((len(jobs), m), dtype=torch.long)
        pos = torch.zeros((len(jobs), m), dtype=torch.long)
        for r, ((ids, _, _), c) in enumerate(zip(jobs, commons)):
            k = len(ids) - c
            x[r, :k] = torch.tensor(ids[c:])
            pos[r, :k] = torch.arange(c, len(ids))
            allow[r, :, :c] = True
            allow[r, :, width:] = torch.ones(m, m, dtype=torch.bool).tril()
        mask = torch.zeros((len(jobs), 1, m, width + m), dtype=dtype)
        mask.masked_fill_(~allow[:, None], torch.finfo(dtype).min)
        with _gqa_in_sdpa():
            h = self.model.get_decoder()(input_ids=x.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                                         cache=batch, use_cache=True).last_hidden_state
        self.counters.forwards += 1
        self.counters.tokens += len(jobs) * m
        out = []
        for r, ((ids, row, _), c) in enumerate(zip(jobs, commons)):
            k = len(ids) - c
            cache = _unstack(batch, r, [(0, c), (width, width + k)], self.model.config)
            hr = torch.cat([row.h[:c], h[r, :k]]) if c else h[r, :k]
            self._rows[tuple(ids)] = _Row(tuple(ids), cache, hr)
            out.append(hr)
        return out

    def score_rows(self, rows: Sequence[tuple[Sequence[int], int, Sequence[Sequence[int]] | None]]) -> list[Scored]:
        """`score` of many rows in ONE right-padded forward (the caller sizes the batch, as the
        hidden stage does: rows sorted by length, ~batch_tokens padded tokens). Each row's cache
        stays available until `release`, so a search on it branches without a second pass; a
        row's slice is copied out of the batch's cache only when it is used."""
        import torch
        from transformers.cache_utils import DynamicCache

        from draftgate.target import capturing

        rows = [(list(ids), start, ask) for ids, start, ask in rows]
        for ids, start, _ in rows:
            if not 1 <= start <= len(ids):
                raise ScoreError(f"start {start} must be in 1..{len(ids)} (the first token has no context)")
        width = max(len(ids) for ids, _, _ in rows)
        x = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for k, (ids, _, _) in enumerate(rows):
            x[k, :len(ids)] = torch.tensor(ids)
            mask[k, :len(ids)] = 1
        cache = DynamicCache(config=self.model.config)
        decoder = self.model.get_decoder()
        hooks = contextlib.nullcontext() if self.capture is None else \
            capturing(decoder, self.capture[0], len(rows), width, getattr(torch, self.capture[1]))
        with torch.inference_mode(), hooks as captured:
            h = decoder(input_ids=x.to(self.device), attention_mask=mask.to(self.device),
                        cache=cache, use_cache=True).last_hidden_state
        if captured is not None:
            self._features.update({tuple(ids): (captured[0][k, :len(ids)].cpu(), captured[1][k, :len(ids)].cpu())
                                   for k, (ids, _, _) in enumerate(rows)})
        with torch.inference_mode():
            # The head over every row's completion positions at once.
            states = torch.cat([h[k, start - 1:len(ids) - 1] for k, (ids, start, _) in enumerate(rows)])
            targets = [t for ids, start, _ in rows for t in ids[start:]]
            asks = [a for ids, start, ask in rows for a in (ask or [()] * (len(ids) - start))]
            mine, asked = self._logprobs(states, targets, asks)
        self.counters.forwards += 1
        self.counters.tokens += len(rows) * width
        out, i = [], 0
        for k, (ids, start, _) in enumerate(rows):
            n = len(ids) - start
            out.append(Scored(mine[i:i + n], asked[i:i + n]))
            i += n
            self._pending[tuple(ids)] = (cache, k, h)
        return out

    def features(self, ids: Sequence[int]) -> tuple[Any, Any] | None:
        """(aux [T,3,H], final [T,H]) of a row of the last `score_rows` batch, on the CPU (with capture)."""
        return self._features.get(tuple(ids))

    def release(self, keys: Iterable[tuple[int, ...]] | None = None) -> None:
        """Drop the caches and features of the bases `keys` (score_rows' rows and every base cached
        since; None: all of them)."""
        if keys is None:
            self._pending, self._features, self._rows, self._last = {}, {}, {}, None
            return
        for key in keys:
            self._pending.pop(key, None)
            self._features.pop(key, None)
            self._rows.pop(key, None)
            if key == self._last:
                self._last = None

    def _adopt(self, key: tuple[int, ...]) -> None:
        """Make a row of the last score_rows batch a cached base (its slice of the batch cache)."""
        if key not in self._pending or key in self._rows:
            return
        batch_cache, k, h = self._pending.pop(key)
        self._rows[key] = _Row(key, _unstack(batch_cache, k, [(0, len(key))], self.model.config), h[k, :len(key)])

    def _on_base(self, base: list[int]) -> _Row:
        key = tuple(base)
        self._adopt(key)
        if key not in self._rows:
            self.score(base, len(base), replace=base)     # scored afresh: no other base is touched
        self._last = key
        return self._rows[key]

    def score_branches(self, base: Sequence[int], branches: Sequence[tuple[int, Sequence[int]]]) -> list[list[float]]:
        base = list(base)
        row = self._on_base(base)
        row.drop_tree()
        out: list[list[float]] = []
        group: list[tuple[int, Sequence[int]]] = []
        size = 0
        for at, ids in branches:
            if not 1 <= at <= len(base) or not ids:
                raise ScoreError(f"branch at {at} with {len(ids)} ids: needs 1 <= at <= {len(base)} and ids")
            if group and size + len(ids) > self.branch_tokens:
                out += self._branch_forward(row, group)
                group, size = [], 0
            group.append((at, ids))
            size += len(ids)
        if group:
            out += self._branch_forward(row, group)
        return out

    def score_branches_many(self, asks: Sequence[tuple[Sequence[int], Sequence[tuple[int, Sequence[int]]]]]
                            ) -> list[list[list[float]]]:
        """`score_branches` for several (base, branches) of different rows (search_rows' runner-ups
        re-scored in the same step): unpadded (_flat), every row's branches in one forward on its
        own cache, which is cut back to its base after; a padded decoder scores them row by row."""
        import torch

        out: list[list[list[float]] | None] = [None] * len(asks)
        todo = []
        for i, (base, branches) in enumerate(asks):
            base, branches = list(base), [(at, list(ids)) for at, ids in branches]
            fed = sum(len(ids) - 1 for _, ids in branches)
            if not self.flat or fed > self.branch_tokens or any(not 1 <= at <= len(base) or not ids
                                                                for at, ids in branches):
                out[i] = self.score_branches(base, branches)       # it splits them, or says what is wrong
            else:
                todo.append((i, self._on_base(base), branches, fed))
        while todo:
            group, rest, held, size = [], [], set(), 0
            for job in todo:
                if id(job[1]) in held or (group and size + job[3] > self.branch_tokens):
                    rest.append(job)
                else:
                    group.append(job)
                    size += job[3]
                held.add(id(job[1]))                 # two searches on one row: one forward each
            pieces, rows = [], []
            for _, row, branches, fed in group:
                row.drop_tree()
                if fed:
                    n = row.cache.get_seq_length()
                    allow = torch.zeros((fed, n + fed), dtype=torch.bool)
                    ids, pos, off = [], [], 0
                    for at, b in branches:
                        allow[off:off + len(b) - 1, :at] = True
                        allow[off:off + len(b) - 1, n + off:n + off + len(b) - 1] = \
                            torch.ones(len(b) - 1, len(b) - 1, dtype=torch.bool).tril()
                        ids += b[:-1]
                        pos += range(at, at + len(b) - 1)
                        off += len(b) - 1
                    pieces.append((row.cache, ids, pos, allow))
                    rows.append(row)
            states = dict(zip(map(id, rows), self._flat(pieces))) if pieces else {}
            for row in rows:
                row.cache.crop(len(row.ids) - row.cache.get_seq_length())   # back to the base
            with torch.inference_mode():
                parts, targets = [], []
                for _, row, branches, _ in group:
                    h, off = states.get(id(row)), 0
                    for at, b in branches:
                        parts.append(row.h[at - 1:at])
                        if len(b) > 1:
                            parts.append(h[off:off + len(b) - 1])
                        off += len(b) - 1
                        targets += b
                lps, _ = self._logprobs(torch.cat(parts), targets) if parts else ([], [])
            i = 0
            for k, _, branches, _ in group:
                out[k] = []
                for _, b in branches:
                    out[k].append(lps[i:i + len(b)])
                    i += len(b)
            todo = rest
        return out  # type: ignore[return-value]

    def score_nodes(self, base: Sequence[int], nodes: Sequence[tuple[int, Sequence[int], Sequence[int]]]
                    ) -> list[list[float]]:
        """Per (at, path, ask): the tempered log-probabilities of the ask ids after base[:at] + path.

        Every path's tokens stay in the cache, after the base's, until the base changes: a node
        whose parent was scored before costs ONE forwarded token (attending to base[:at] and its
        ancestors' columns, a tree mask), and the windows that share a node share that token. So
        the search pays per distinct branch prefix, not per window (docs/repair.md, "Windows")."""
        return self.score_nodes_many([(base, nodes)])[0]

    def score_nodes_many(self, asks: Sequence[tuple[Sequence[int], Sequence[tuple[int, Sequence[int], Sequence[int]]]]]
                         ) -> list[list[list[float]]]:
        """`score_nodes` for several (base, nodes) of different rows (search_rows' searches in step):
        their new nodes in one forward where they fit in branch_tokens (_grow), so a round of every
        row costs about one reading of the weights instead of one per row."""
        import torch

        rows = []
        new: dict[int, tuple[_Row, list[tuple[int, tuple[int, ...]]]]] = {}   # id(row) -> its new nodes
        for base, nodes in asks:
            base = list(base)
            row = self._on_base(base)
            rows.append(row)
            _, keys = new.setdefault(id(row), (row, []))   # two searches on the same ids share a row
            for at, path, _ in nodes:
                if not 1 <= at <= len(base) or not path:
                    raise ScoreError(f"node at {at} with {len(path)} ids: needs 1 <= at <= {len(base)} and a path")
                for j in range(1, len(path) + 1):
                    key = (at, tuple(path[:j]))
                    if key not in row.tree and key not in keys:
                        keys.append(key)          # ancestors first: a prefix is met before its extensions
        work: list[tuple[_Row, list[tuple[int, tuple[int, ...]]]]] = []
        for row, keys in new.values():
            for k in range(0, len(keys), self.branch_tokens):
                work.append((row, keys[k:k + self.branch_tokens]))
        # Forwards of at most branch_tokens tokens (padded ones too): the largest first, each row's pieces in
        # order (a later piece's ancestors are in an earlier one).
        work.sort(key=lambda w: -len(w[1]))           # stable: a row's pieces stay in order
        while work:
            group, rest, held = [], [], set()
            size = 0
            for row, keys in work:
                if id(row) in held or (group and not self._joins(len(group), len(group[0][1]), size, len(keys))):
                    rest.append((row, keys))
                else:
                    group.append((row, keys))
                    size += len(keys)
                held.add(id(row))                        # one piece of a row a forward, in order
            self._grow(group)
            work = rest
        head = self.model.get_output_embeddings()
        out: list[list[list[float]]] = []
        flat = [(row, at, path, ask) for row, (_, nodes) in zip(rows, asks) for at, path, ask in nodes]
        lps: list[list[float]] = []
        with torch.inference_mode():
            for a in range(0, len(flat), HEAD_ROWS):
                part = flat[a:a + HEAD_ROWS]
                states = torch.stack([row.tree[(at, tuple(path))][1] for row, at, path, _ in part])
                lps += picked_logprobs(head(states), self.sampling, [list(ask) for _, _, _, ask in part])
        i = 0
        for _, nodes in asks:
            out.append(lps[i:i + len(nodes)])
            i += len(nodes)
        return out

    def _joins(self, count: int, first: int, size: int, new: int) -> bool:
        """Whether a row of `new` tokens joins a forward of `count` rows, `size` tokens in all, led
        by one of `first`: unpadded (_flat), within branch_tokens; padded, `_joins`."""
        if self.flat:
            return size + new <= self.branch_tokens
        return _joins(count, first, new, self.branch_tokens)

    def _grow(self, group: Sequence[tuple[_Row, Sequence[tuple[int, tuple[int, ...]]]]]) -> None:
        """Forward each key's last token (its ancestors are in its row's tree or earlier in its keys)
        and keep it in that row's cache. Unpadded (_flat): every row's on its own cache. Padded:
        one row on its own cache; several, their caches copied into a right-padded batch, each
        row's new tokens after the widest (a 4D tree mask), then appended to each row's own cache."""
        import torch

        if self.flat:
            # Every row's new nodes in one unpadded forward on the rows' own caches (_flat).
            pieces, widths = [], []
            for row, keys in group:
                w = row.cache.get_seq_length()
                local = {key: w + o for o, key in enumerate(keys)}
                allow = torch.zeros((len(keys), w + len(keys)), dtype=torch.bool)
                for o, (at, path) in enumerate(keys):
                    allow[o, :at] = True
                    allow[o, w + o] = True
                    for j in range(1, len(path)):
                        anc = (at, path[:j])
                        allow[o, row.tree[anc][0] if anc in row.tree else local[anc]] = True
                pieces.append((row.cache, [path[-1] for _, path in keys], [at + len(path) - 1 for at, path in keys],
                               allow))
                widths.append(w)
            for (row, keys), w, h in zip(group, widths, self._flat(pieces)):
                for o, key in enumerate(keys):
                    row.tree[key] = (w + o, h[o])
            return
        dev, dtype = self.device, next(self.model.parameters()).dtype
        widths = [row.cache.get_seq_length() for row, _ in group]
        width = max(widths)
        m = max(len(keys) for _, keys in group)
        allow = torch.zeros((len(group), m, width + m), dtype=torch.bool)
        x = torch.zeros((len(group), m), dtype=torch.long)
        pos = torch.zeros((len(group), m), dtype=torch.long)
        for r, (row, keys) in enumerate(group):
            local = {key: width + o for o, key in enumerate(keys)}
            for o, (at, path) in enumerate(keys):
                allow[r, o, :at] = True
                for j in range(1, len(path)):
                    anc = (at, path[:j])
                    allow[r, o, row.tree[anc][0] if anc in row.tree else local[anc]] = True
                x[r, o] = path[-1]
                pos[r, o] = at + len(path) - 1
            for o in range(m):
                allow[r, o, width + o] = True        # padding attends to itself alone
        mask = torch.zeros((len(group), 1, m, width + m), dtype=dtype)
        mask.masked_fill_(~allow[:, None], torch.finfo(dtype).min)
        cache = group[0][0].cache if len(group) == 1 else _stack([row.cache for row, _ in group], widths, width,
                                                                 self.model.config, m)
        with torch.inference_mode(), _gqa_in_sdpa():
            h = self.model.get_decoder()(input_ids=x.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                                         cache=cache, use_cache=True).last_hidden_state
            for r, (row, keys) in enumerate(group):
                if len(group) > 1:
                    for li, layer in enumerate(cache.layers):
                        row.cache.update(layer.keys[r:r + 1, :, width:width + len(keys)],
                                         layer.values[r:r + 1, :, width:width + len(keys)], li)
                for o, key in enumerate(keys):
                    row.tree[key] = (widths[r] + o, h[r, o])
        self.counters.forwards += 1
        self.counters.tokens += len(group) * m

    def _flat(self, pieces: Sequence[tuple[Any, Sequence[int], Sequence[int], Any]]) -> list[Any]:
        """One forward of several rows' new tokens, unpadded: per (cache, ids, positions, allow),
        the ids are appended to that row's own cache and attend where `allow` ([new, cached + new]
        bool) says. The projections and the MLP run once over every row's tokens laid end to end,
        and only the attention runs row by row, on each row's cache as it is. The padded batch it
        replaces copied every row's cache into a batch and computed each row's padding like a
        token: a round of 20 rows x 2-16 nodes on ~300 cached tokens took 990 ms that way against
        618 ms this one (this CPU, 2026-12-07). Counts one forward and the real tokens. Returns
        each row's new states."""
        import torch
        import torch.nn.functional as F

        dec, dev = self.model.get_decoder(), self.device
        ids = [t for _, new, _, _ in pieces for t in new]
        n = len(ids)
        ends = list(itertools.accumulate(len(new) for _, new, _, _ in pieces))
        spans = list(zip([0, *ends[:-1]], ends))
        with torch.inference_mode():
            masks = [allow.to(dev)[None, None] for _, _, _, allow in pieces]
            x = dec.embed_tokens(torch.tensor([ids], dtype=torch.long, device=dev))
            cos, sin = dec.rotary_emb(x, torch.tensor([[p for _, _, pos, _ in pieces for p in pos]], device=dev))
            cos, sin = cos[:, None], sin[:, None]
            for li, layer in enumerate(dec.layers):
                att = layer.self_attn
                h = layer.input_layernorm(x)
                q = att.q_proj(h).view(1, n, -1, att.head_dim)
                k = att.k_proj(h).view(1, n, -1, att.head_dim)
                v = att.v_proj(h).view(1, n, -1, att.head_dim).transpose(1, 2)
                if hasattr(att, "q_norm"):                  # Qwen3: per-head norms before the rotation
                    q, k = att.q_norm(q), att.k_norm(k)
                q, k = q.transpose(1, 2), k.transpose(1, 2)
                q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
                outs = []
                for (cache, _, _, _), (a, b), mask in zip(pieces, spans, masks):
                    keys, values = cache.update(k[:, :, a:b], v[:, :, a:b], li)
                    outs.append(F.scaled_dot_product_attention(q[:, :, a:b], keys, values, attn_mask=mask,
                                                               scale=att.scaling, enable_gqa=True))
                x = x + att.o_proj(torch.cat(outs, dim=2).transpose(1, 2).reshape(1, n, -1))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            x = dec.norm(x)[0]
        self.counters.forwards += 1
        self.counters.tokens += n
        return [x[a:b] for a, b in spans]

    def _branch_forward(self, row: _Row, group: Sequence[tuple[int, Sequence[int]]]) -> list[list[float]]:
        """One tree-masked pass over every branch's tokens but its last: token 0 of a branch is
        predicted by the base's state at at-1, token i by the branch's token i-1, so the last
        token's own state is never needed (forwarding it cost a third of the window tokens)."""
        import torch

        cache, base_h = row.cache, row.h
        n = base_h.shape[0]
        fed: list[int] = []              # the tokens forwarded: each branch without its last
        pos: list[int] = []
        rows = []
        for at, ids in group:
            rows.append((len(fed), at, len(ids)))
            fed += list(ids[:-1])
            pos += range(at, at + len(ids) - 1)
        m = len(fed)
        dev, dtype = self.device, next(self.model.parameters()).dtype
        with torch.inference_mode():
            h = None                     # one-token branches only: the base's states predict them all
            if m:
                allow = torch.zeros((m, n + m), dtype=torch.bool)
                for off, at, k in rows:
                    allow[off:off + k - 1, :at] = True                               # the shared prefix
                    allow[off:off + k - 1, n + off:n + off + k - 1] = torch.ones(k - 1, k - 1, dtype=torch.bool).tril()
                mask = torch.zeros((1, 1, m, n + m), dtype=dtype)
                mask.masked_fill_(~allow[None, None], torch.finfo(dtype).min)
                x = torch.tensor([fed], dtype=torch.long, device=dev)
                with _gqa_in_sdpa():
                    h = self.model.get_decoder()(input_ids=x, attention_mask=mask.to(dev),
                                                 position_ids=torch.tensor([pos], device=dev),
                                                 cache=cache, use_cache=True).last_hidden_state[0]
                cache.crop(-m)               # the base stays cached for the next group (crop takes -tokens)
                self.counters.forwards += 1
                self.counters.tokens += m
            states = torch.cat([torch.cat([base_h[at - 1:at], h[off:off + k - 1]]) if k > 1 else base_h[at - 1:at]
                                for off, at, k in rows])
            lps, _ = self._logprobs(states, [t for _, ids in group for t in ids])
        out, i = [], 0
        for _, _, k in rows:
            out.append(lps[i:i + k])
            i += k
        return out


# A row joins a padded forward whose widest row has `first` new tokens when it pads by at most this
# many: on this CPU a forward costs ~45 ms before its tokens (~3.3 ms each), so padding a row by
# more than ~12 tokens costs more than a forward of its own.
PAD_SLACK = 12

# Columns a cached row's buffers keep free for the trie nodes and re-scores appended to it
# (_Filled): a pass scores a few dozen nodes a row at T 1.0. More are met by growing the buffers.
ROW_ROOM = 64


def _joins(count: int, first: int, size: int, budget: int) -> bool:
    """Whether a row of `size` new tokens joins a group of `count` rows led by one of `first`
    (the group is filled largest first): little padding, and the batch within `budget` tokens."""
    return first - size <= PAD_SLACK and (count + 1) * first <= budget


class _Row:
    """A cached base: its ids, its KV cache (the base's columns, then score_nodes' trie columns) and
    its last hidden states; `tree`: (at, path) -> (its column in the cache, its state)."""

    def __init__(self, ids: tuple[int, ...], cache: Any, h: Any):
        self.ids, self.cache, self.h = ids, cache, h
        self.tree: dict[tuple[int, tuple[int, ...]], tuple[int, Any]] = {}

    def drop_tree(self) -> None:
        """Cut the trie's columns off the cache, so it holds the base alone again."""
        if self.tree:
            self.cache.crop(len(self.ids) - self.cache.get_seq_length())    # crop takes minus the tokens to drop
        self.tree = {}


@contextlib.contextmanager
def _gqa_in_sdpa() -> Any:
    """Grouped-query attention inside SDPA (enable_gqa) for the forwards on a cached prefix: with a
    mask, transformers otherwise copies every cached key and value once per query-head group
    (`repeat_kv`) in every layer of every forward: a third of a node round of 20 rows x 16 nodes
    on ~300 cached tokens on this CPU (2.8 s -> 1.8 s), though inside the noise of a whole bench
    (docs/repair.md, "Measured"). Its switch is an environment
    variable read at each call (integrations/sdpa_attention.py, TRANSFORMERS_SDPA_FORCE_GQA); it is
    set only around these forwards, so the base pass (the hidden stage's prefill) is untouched."""
    import os

    old = os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA")
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRANSFORMERS_SDPA_FORCE_GQA"]
        else:
            os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = old


def _rotate_half(x: Any) -> Any:
    import torch

    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


# The decoders HFScorer._flat runs by their parts: their layers are exactly a pre-norm attention
# (q, k, v, o projections, rotary positions, optional per-head q/k norms) and a pre-norm MLP, with
# no sliding window. Any other model takes the padded batch through its own forward.
_FLAT_TYPES = {"llama", "qwen2", "qwen3"}
_FLAT_LAYER = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
_FLAT_ATTENTION = ({"q_proj", "k_proj", "v_proj", "o_proj"},
                   {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"})


def _flat_decoder(model: Any) -> Any | None:
    """The model's decoder where HFScorer._flat can run it by its parts, else None."""
    config = model.config
    if getattr(config, "model_type", None) not in _FLAT_TYPES:
        return None
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return None
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return None
    dec = model.get_decoder()
    if not all(hasattr(dec, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return None
    for layer in dec.layers:
        if {name for name, _ in layer.named_children()} != _FLAT_LAYER or \
                {name for name, _ in layer.self_attn.named_children()} not in _FLAT_ATTENTION:
            return None
    return dec


def _stack(caches: Sequence[Any], widths: Sequence[int], width: int, config: Any, room: int = 0) -> Any:
    """A DynamicCache of batch len(caches): row r holds caches[r]'s first widths[r] columns (None:
    nothing), right-padded to `width` with zeros (masked by the caller), with `room` columns after
    them that the forward's new keys and values are written into in place (_Filled)."""
    from transformers.cache_utils import DynamicCache

    ref = next(c for c in caches if c is not None) if any(c is not None for c in caches) else None
    out = DynamicCache(config=config)
    if ref is None:
        return out
    for li, layer in enumerate(ref.layers):
        shape = (len(caches), layer.keys.shape[1], width + room, layer.keys.shape[3])
        keys = layer.keys.new_zeros(shape)
        values = layer.values.new_zeros(shape)
        for r, (c, w) in enumerate(zip(caches, widths)):
            if c is not None and w:
                keys[r, :, :w] = c.layers[li].keys[0, :, :w]
                values[r, :, :w] = c.layers[li].values[0, :, :w]
        out.layers[li] = _filled()(keys, values, width)
    return out


@functools.cache
def _filled() -> type:
    """A cache layer over buffers with room after its filled columns: `update` writes the new ones
    in place, growing the buffers only when the room runs out. A DynamicLayer concatenates
    instead: each node round copied every row's cache three times, into the batch, to append the
    round's columns in the forward, and to append them to the row's own cache (~0.8 ms a trie
    node on this CPU, sampled by py-spy; docs/repair.md)."""
    from transformers.cache_utils import DynamicLayer

    class Filled(DynamicLayer):
        def __init__(self, keys: Any, values: Any, filled: int):
            super().__init__()
            self.room_keys, self.room_values, self.filled = keys, values, filled
            self.keys, self.values = keys[..., :filled, :], values[..., :filled, :]
            self.device, self.is_initialized = keys.device, True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            end = self.filled + key_states.shape[-2]
            if end > self.room_keys.shape[-2]:        # no room left: move to buffers with more
                shape = (*self.room_keys.shape[:-2], end + max(ROW_ROOM, end // 4), self.room_keys.shape[-1])
                keys, values = self.room_keys.new_empty(shape), self.room_values.new_empty(shape)
                keys[..., :self.filled, :] = self.keys
                values[..., :self.filled, :] = self.values
                self.room_keys, self.room_values = keys, values
            self.room_keys[..., self.filled:end, :] = key_states
            self.room_values[..., self.filled:end, :] = value_states
            self.filled = end
            self.keys, self.values = self.room_keys[..., :end, :], self.room_values[..., :end, :]
            return self.keys, self.values

        def crop(self, tokens_to_remove: int) -> None:
            super().crop(tokens_to_remove)           # the columns cut stay in the buffer, to be written over
            self.filled = self.keys.shape[-2]

    return Filled


def _unstack(batch: Any, r: int, spans: Sequence[tuple[int, int]], config: Any) -> Any:
    """A DynamicCache of batch 1: row r of `batch`, its columns [a, b) of each span, in order, in
    buffers with ROW_ROOM columns more for the trie's (_Filled)."""
    from transformers.cache_utils import DynamicCache

    out = DynamicCache(config=config)
    n = sum(b - a for a, b in spans)
    for li, layer in enumerate(batch.layers):
        shape = (1, layer.keys.shape[1], n + ROW_ROOM, layer.keys.shape[3])
        keys, values, at = layer.keys.new_empty(shape), layer.values.new_empty(shape), 0
        for a, b in spans:
            keys[0, :, at:at + b - a] = layer.keys[r, :, a:b]
            values[0, :, at:at + b - a] = layer.values[r, :, a:b]
            at += b - a
        out.layers[li] = _filled()(keys, values, n)
    return out


# ---------------------------------------------------------------- engines over HTTP (top-k raw)

class Bound(float):
    """A tempered log-probability known only from above: a token below an engine's top k is at most
    as likely as the k-th. Arithmetic on it gives plain floats; only a value read as returned is one."""

    __slots__ = ()


class NodeAnswer(list):
    """An engine's answer for one trie node: the asked ids' values (a list, as in process), some of
    them `Bound`s, and `path`: the exact values of the node's own path tokens (the request carried
    them in its prompt, and the engine returns a prompt token's log-probability whatever its rank),
    or None where the request asked for none (VllmScorer's cached nodes)."""

    def __init__(self, asked: Sequence[float], path: Sequence[float] | None = None):
        super().__init__(asked)
        self.path = None if path is None else list(path)


@dataclass(frozen=True)
class RawPosition:
    """One position of an engine's answer: raw (temperature 1) log-probabilities."""
    token: int
    logprob: float
    rank: int | None                 # 1-based in the full vocabulary, when the engine says
    top: dict[int, float]            # the engine's top k at this position


def temper(raw: RawPosition, sampling: Sampling, ids: Sequence[int] = ()) -> dict[int, float]:
    """Tempered, nucleus-applied log-probabilities of raw.token and `ids` (module docstring: the
    approximation). An id the answer does not carry is below the top k: a `Bound` at the k-th's
    value, or -inf where the top k already fill top_k or the nucleus (it could not be sampled)."""
    known = dict(raw.top)
    known[raw.token] = raw.logprob
    lps = sorted(raw.top.values(), reverse=True)
    t = sampling.temperature
    out: dict[int, float] = {}
    wanted = [raw.token, *ids]
    if t == 0:
        best = max(known, key=known.get)
        return {i: (0.0 if i == best else NEG_INF) for i in wanted}
    tail = 0.0
    if lps:
        tail = max(0.0, 1.0 - sum(math.exp(v) for v in lps))
        z = _logsumexp([v / t for v in lps] + ([math.log(tail) + (1 / t - 1) * lps[-1]] if tail > 0 else []))
    else:
        z = 0.0 if t == 1 else raw.logprob / t      # no top k asked: the token alone, unnormalised
    tempered_top = [v / t - z for v in lps]             # descending
    top_mass = sum(math.exp(v) for v in tempered_top)
    # The nucleus's mass: the known tokens until it reaches top_p; where the top k fall short,
    # the nucleus runs on below them and its mass is taken as top_p itself.
    nucleus_mass, acc = sampling.top_p, 0.0
    for w in tempered_top:
        acc += math.exp(w)
        if acc >= sampling.top_p:
            nucleus_mass = acc
            break
    # A token outside the answer, if it can be drawn at all, is at most as likely as the k-th and
    # at most the raw mass the top k leave (the tighter where the top k hold nearly everything).
    below = NEG_INF
    if lps and not (sampling.top_k and len(raw.top) >= sampling.top_k) and not (
            sampling.top_p < 1 and top_mass >= sampling.top_p):
        most = min(lps[-1], math.log(tail)) if tail > 0 else lps[-1]
        below = Bound(most / t - z - (math.log(nucleus_mass) if sampling.top_p < 1 else 0.0))
    for i in wanted:
        if i not in known:
            out[i] = below
            continue
        v = known[i] / t - z
        in_top = i in raw.top
        if sampling.top_k:
            rank = raw.rank if i == raw.token and raw.rank is not None else (
                1 + sum(1 for w in raw.top.values() if w > known[i]) if in_top else None)
            if rank is None and len(raw.top) >= sampling.top_k:
                rank = sampling.top_k + 1      # below a top k at least as long as top_k
            if rank is not None and rank > sampling.top_k:
                out[i] = NEG_INF
                continue
        if sampling.top_p < 1:
            before = (sum(math.exp(w / t - z) for w in raw.top.values() if w > known[i]) if in_top
                      else top_mass)
            if before >= sampling.top_p:
                out[i] = NEG_INF
                continue
            v -= math.log(nucleus_mass)
        out[i] = v
    return out


def _logsumexp(xs: Sequence[float]) -> float:
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs))


def post_json(url: str, body: dict, timeout_s: float = 120.0) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise ScoreError(f"{url}: HTTP {e.code}: {e.read()[:500]!r}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ScoreError(f"{url}: {e}; is the engine running at that address?") from None


class _HTTPScorer:
    """Both questions answered from one primitive: `_positions(ids, start)` -> RawPosition per
    position start..len(ids)-1. A branch is its own request (base[:at] + branch ids).

    The requests of one call (a search round's branches, a batch's rows) are sent together, at
    most `concurrency` in flight: the engine batches concurrent requests itself. One at a time,
    the real vLLM took 21-42 s for one demo row's search on 2 loaded cores (51-83 requests of
    ~0.5 s each) against 6-17 s in process."""

    def __init__(self, base_url: str, model: str | None, sampling: Sampling, top_logprobs: int = 20,
                 post: Any = post_json, concurrency: int = 16, spool: Any = None):
        self.base_url, self.model, self.sampling = base_url.rstrip("/"), model, sampling
        self.top_logprobs, self.post, self.concurrency = top_logprobs, post, max(1, concurrency)
        self.counters = Counters()
        # repair/engine.py's SpoolCapture: the base pass's requests name a file the engine writes
        # the row's hidden states to (an engine draftgate started with the hidden settings).
        self.spool = spool

    def score(self, ids: Sequence[int], start: int, ask: Sequence[Sequence[int]] | None = None,
              replace: Sequence[int] | None = None) -> Scored:
        return self.score_rows([(ids, start, ask)])[0]

    def score_many(self, asks: Sequence[tuple[Sequence[int], int, Sequence[Sequence[int]] | None,
                                              Sequence[int] | None]]) -> list[Scored]:
        """Several rows' next bases, their requests in flight together (the engine reuses what it
        cached of each; `replace` means nothing here). Never named: only the first pass is the
        hidden stage's prefill."""
        return self._score([(ids, start, ask) for ids, start, ask, _ in asks], named=False)

    def score_rows(self, rows: Sequence[tuple[Sequence[int], int, Sequence[Sequence[int]] | None]]) -> list[Scored]:
        return self._score(rows, named=self.spool is not None)

    def _score(self, rows: Sequence[tuple[Sequence[int], int, Sequence[Sequence[int]] | None]],
               named: bool) -> list[Scored]:
        for ids, start, _ in rows:
            if not 1 <= start <= len(ids):
                raise ScoreError(f"start {start} must be in 1..{len(ids)} (the first token has no context)")
        out = []
        asks = [(list(ids), start, self.spool.name(ids) if named else None) for ids, start, _ in rows]
        for raws, (_, _, ask) in zip(self._checked_many(asks), rows):
            mine, asked = [], []
            for k, raw in enumerate(raws):
                want = list(ask[k]) if ask else []
                t = temper(raw, self.sampling, want)
                mine.append(t[raw.token])
                asked.append({i: t[i] for i in want})
            out.append(Scored(mine, asked))
        return out

    def features(self, ids: Sequence[int]) -> Any:
        """With a spool: a call that waits for the row's file and returns (aux, final), proven to
        be these ids'. Without one, None: prompt logprobs carry no hidden states (docs/engines.md)."""
        return None if self.spool is None else self.spool.reader(ids)

    def release(self, keys: Iterable[tuple[int, ...]] | None = None) -> None:
        if self.spool is not None:
            self.spool.drop(keys)

    def score_branches(self, base: Sequence[int], branches: Sequence[tuple[int, Sequence[int]]]) -> list[list[float]]:
        base = list(base)
        asks = [(base[:at] + list(ids), at) for at, ids in branches]
        return [[temper(r, self.sampling)[r.token] for r in raws] for raws in self._checked_many(asks)]

    def score_nodes(self, base: Sequence[int], nodes: Sequence[tuple[int, Sequence[int], Sequence[int]]]
                    ) -> list[NodeAnswer]:
        """One request per node: base[:at] + path + its first asked id (no asked id: the path alone),
        the last position's answer tempered for every asked id (an id below the engine's top k: a
        `Bound`, as in `score`), and the path's own tokens' exact values (`NodeAnswer.path`)."""
        return self.score_nodes_many([(base, nodes)])[0]

    def score_nodes_many(self, asks: Sequence[tuple[Sequence[int], Sequence[tuple[int, Sequence[int], Sequence[int]]]]]
                         ) -> list[list[NodeAnswer]]:
        """`score_nodes` of several rows, every node's request in flight together."""
        for _, nodes in asks:
            for at, path, ask in nodes:
                if not path and not ask:
                    raise ScoreError(f"a trie node at {at} asks nothing: give it a path or tokens to score")
        reqs = [(list(base)[:at] + list(path) + list(ask[:1]), at) for base, nodes in asks for at, path, ask in nodes]
        answers = iter(self._checked_many(reqs))
        out = []
        for _, nodes in asks:
            mine = []
            for _, path, ask in nodes:
                raws = next(answers)
                t = temper(raws[-1], self.sampling, list(ask)) if ask else {}
                mine.append(NodeAnswer([t[i] for i in ask], [temper(r, self.sampling)[r.token] for r in raws[:len(path)]]))
            out.append(mine)
        return out

    def _checked_many(self, asks: Sequence[tuple[list[int], int] | tuple[list[int], int, str | None]]
                      ) -> list[list[RawPosition]]:
        """Each (ids, start[, file name]) scored and checked (`_check`), the requests in flight
        together; answers in order."""
        return [self._check(a[0], a[1], raws) for a, raws in zip(asks, self._in_flight(self._positions, asks))]

    def _in_flight(self, request: Any, args: Sequence[tuple]) -> list[Any]:
        """request(*a) for each a, at most `concurrency` in flight (the engine batches them); in order.
        The answers are checked and counted by the caller, on this thread."""
        if len(args) <= 1 or self.concurrency == 1:
            return [request(*a) for a in args]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(self.concurrency, len(args))) as pool:
            return list(pool.map(lambda a: request(*a), args))

    def _check(self, ids: list[int], start: int, raws: list[RawPosition]) -> list[RawPosition]:
        self.counters.forwards += 1
        self.counters.tokens += len(ids)
        if len(raws) != len(ids) - start:
            raise ScoreError(f"{self.base_url}: {len(raws)} scored positions for {len(ids) - start} asked "
                             f"(positions {start}..{len(ids) - 1}); the engine's logprob fields have another shape")
        for k, r in enumerate(raws):
            if r.token != ids[start + k]:
                raise ScoreError(f"{self.base_url}: position {start + k} scored token {r.token}, but {ids[start + k]} "
                                 "was sent; the engine's answer is misaligned (another logprob layout?)")
        return raws


class VllmScorer(_HTTPScorer):
    """vLLM's (and the local server's) /v1/completions with `prompt_logprobs` (module docstring).

    `cached_nodes`: the engine runs with a prefix cache (repair/engine.py starts it so). A trie
    node that asks for the tokens after it is then a one-token generation request with `logprobs:
    k` and no prompt log-probabilities: vLLM returns the RAW top k of the next token's distribution
    (its default `raw_logprobs`: before temperature and nucleus, tempered here as a prompt position
    is), and the request is served from the prefix cache the row's first pass filled, so the
    engine computes the node's few tokens, not the row (0.11-0.13 s against 0.42-0.49 s a node on a
    120-token row, this CPU). Requests that ask for prompt log-probabilities never read the cache
    (vLLM's rule), so a node asked for its path's values is sent as before. Greedy: the generated
    token is not ours to trust (with the hidden capture's speculative config, vLLM 0.32 on CPU
    sometimes samples a token 36 nats down, and its processed logprobs are then wrong), the raw top
    k are right: they matched the in-process target at every position tried, cached or not
    (docs/repair.md, "Scoring backends"); tests/test_engine_vllm.py holds the search's decision.
    """

    def __init__(self, *args: Any, cached_nodes: bool = False, node_top: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cached_nodes = cached_nodes
        self.node_top = node_top or self.top_logprobs

    def score_nodes_many(self, asks: Sequence[tuple[Sequence[int], Sequence[tuple[int, Sequence[int], Sequence[int]]]]]
                         ) -> list[list[NodeAnswer]]:
        if not self.cached_nodes:
            return super().score_nodes_many(asks)
        nexts = [list(base)[:at] + list(path) for base, nodes in asks for at, path, ask in nodes if ask]
        for_path = [(base, [(at, path, ask) for at, path, ask in nodes if not ask]) for base, nodes in asks]
        after_it = iter(self._in_flight(self._next, [(ids,) for ids in nexts]))
        self.counters.forwards += len(nexts)
        self.counters.tokens += sum(map(len, nexts))
        path_it = iter([a for row in super().score_nodes_many(for_path) for a in row])
        out = []
        for _, nodes in asks:
            mine = []
            for _, _, ask in nodes:
                if not ask:
                    mine.append(next(path_it))
                    continue
                t = temper(next(after_it), self.sampling, list(ask))
                mine.append(NodeAnswer([t[i] for i in ask]))
            out.append(mine)
        return out

    def _next(self, ids: list[int]) -> RawPosition:
        """The raw top k of the token after `ids`, as a position whose token is the likeliest."""
        body = {"prompt": ids, "max_tokens": 1, "temperature": 0.0, "logprobs": self.node_top,
                "return_tokens_as_token_ids": True}
        if self.model:
            body["model"] = self.model
        answer = self.post(f"{self.base_url}/v1/completions", body)
        try:
            entries = answer["choices"][0]["logprobs"]["top_logprobs"][0]
            sent = answer["usage"]["prompt_tokens"]
        except (KeyError, IndexError, TypeError):
            raise ScoreError(f"{self.base_url}/v1/completions: no choices[0].logprobs.top_logprobs[0] or usage in the "
                             f"answer ({str(answer)[:300]}); is this vLLM with logprobs?") from None
        if sent != len(ids):
            raise ScoreError(f"{self.base_url}: the engine counted {sent} prompt tokens for {len(ids)} sent; "
                             "its answer is for another prompt")
        top: dict[int, float] = {}
        for key, v in entries.items():
            if not key.startswith("token_id:"):
                raise ScoreError(f"{self.base_url}: logprobs key {key!r} is not a token id; the engine ignored "
                                 "return_tokens_as_token_ids")
            top[int(key.removeprefix("token_id:"))] = float(v)
        # The generated token is in the answer beside the top k where it is not one of them.
        top = dict(sorted(top.items(), key=lambda kv: -kv[1])[:self.node_top])
        best = max(top, key=top.get)
        return RawPosition(best, top[best], 1, top)

    def request_body(self, ids: Sequence[int], name: str | None = None) -> dict:
        body = {"prompt": list(ids), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": self.top_logprobs}
        if name is not None:     # the connector writes this request's hidden states to <spool>/<name>
            from draftgate.engine.spool import NAME_PARAM

            body["kv_transfer_params"] = {NAME_PARAM: name}
        return {"model": self.model, **body} if self.model else body

    def _positions(self, ids: list[int], start: int, name: str | None = None) -> list[RawPosition]:
        answer = self.post(f"{self.base_url}/v1/completions", self.request_body(ids, name))
        try:
            entries = answer["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise ScoreError(f"{self.base_url}/v1/completions: no choices[0].prompt_logprobs in the answer "
                             f"({str(answer)[:300]}); is this vLLM (or `draftgate serve`) with prompt_logprobs?") from None
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise ScoreError(f"{self.base_url}: prompt_logprobs has {len(entries) if isinstance(entries, list) else '?'} "
                             f"entries for a {len(ids)}-token prompt")
        out = []
        for pos in range(start, len(ids)):
            entry = {int(k): v for k, v in (entries[pos] or {}).items()}
            mine = entry.get(ids[pos])
            if mine is None:
                raise ScoreError(f"{self.base_url}: prompt_logprobs[{pos}] lacks the prompt's own token {ids[pos]}")
            top = sorted(entry.items(), key=lambda kv: (kv[1].get("rank") or 1 << 30, -kv[1]["logprob"]))
            top = {i: float(v["logprob"]) for i, v in top if i != ids[pos] or (v.get("rank") or 1 << 30) <= self.top_logprobs}
            out.append(RawPosition(ids[pos], float(mine["logprob"]), mine.get("rank"), top))
        return out


class SglangScorer(_HTTPScorer):
    """SGLang's native /generate with input_ids and logprob_start_len (module docstring): its radix
    cache keeps a shared prefix, and only positions from logprob_start_len are computed for logprobs."""

    def request_body(self, ids: Sequence[int], start: int) -> dict:
        return {"input_ids": list(ids), "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                "return_logprob": True, "logprob_start_len": start, "top_logprobs_num": self.top_logprobs,
                "return_text_in_logprobs": False}

    def _positions(self, ids: list[int], start: int, name: str | None = None) -> list[RawPosition]:
        if name is not None:
            raise ScoreError("SGLang has no draftgate KV connector: its base pass cannot keep hidden states")
        answer = self.post(f"{self.base_url}/generate", self.request_body(ids, start))
        if isinstance(answer, list):          # a batch answer for one request
            answer = answer[0]
        try:
            meta = answer["meta_info"]
            tokens = meta["input_token_logprobs"]
            tops = meta.get("input_top_logprobs") or [None] * len(tokens)
        except (KeyError, TypeError):
            raise ScoreError(f"{self.base_url}/generate: no meta_info.input_token_logprobs in the answer "
                             f"({str(answer)[:300]}); is return_logprob supported by this SGLang?") from None
        out = []
        for entry, top in zip(tokens, tops):
            lp, tid = entry[0], int(entry[1])
            if lp is None:
                raise ScoreError(f"{self.base_url}: token {tid} has no logprob (the input's first token "
                                 "cannot be scored; start at 1 or later)")
            top = {int(t[1]): float(t[0]) for t in (top or []) if t[0] is not None}
            rank = 1 + sorted(top.values(), reverse=True).index(float(lp)) if tid in top else None
            out.append(RawPosition(tid, float(lp), rank, top))
        return out
