"""Scoring under the target: the in-process backend against plain forwards, the local server's
scoring route, and the HTTP backends against a loopback server speaking vLLM's and SGLang's shapes."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from draftgate.repair.score import (Bound, HFScorer, RawPosition, Sampling, ScoreError, SglangScorer, VllmScorer,
                                    picked_logprobs, temper, tempered_logprobs)

TEXT = "Write a Python function that checks whether a string is a palindrome."


@functools.cache
def local_model():
    """The embedded SmolLM2 target, once per session (test_repair_search imports it too)."""
    from draftgate.serve.model import load

    return load("cpu")


@pytest.fixture(scope="module")
def lm():
    return local_model()


@pytest.fixture(scope="module")
def ids(lm):
    return lm.tokenizer.encode(TEXT)


def full(lm, sampling):
    """The reference: a scorer that runs the model's own forward (never HFScorer._flat)."""
    scorer = HFScorer(lm.model, sampling)
    scorer.flat = False
    return scorer


def assert_branches_like_full(scorer, lm, sampling, base, at, tail):
    """A branch on the cached base scores as a full forward of base[:at] + tail does."""
    branch = scorer.score_branches(base, [(at, tail)])[0]
    plain = full(lm, sampling).score(base[:at] + list(tail), at).logprobs
    assert all(a == b == -math.inf or abs(a - b) < 1e-4 for a, b in zip(branch, plain))


@pytest.fixture(params=[True, False], ids=["unpadded", "padded"])
def flat(request):
    """The forwards on cached rows: unpadded by the decoder's parts (the embedded model's), or a
    padded batch through the model's forward (any other model's)."""
    return request.param


def batched(lm, sampling, rows, flat):
    """A scorer whose forwards on cached rows are `flat` or padded, with `rows` base-passed in one batch."""
    scorer = HFScorer(lm.model, sampling)
    scorer.flat = flat
    scorer.score_rows([(r, 1, None) for r in rows])
    return scorer


def test_the_nucleus_makes_tokens_outside_it_impossible_and_renormalises_the_rest():
    import torch

    logits = torch.tensor([[4.0, 3.0, 1.0, -2.0]])
    lp = tempered_logprobs(logits, Sampling(0.7, top_p=0.8))
    p = lp.exp()[0]
    assert p[2] == 0 and p[3] == 0 and math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)
    greedy = tempered_logprobs(logits, Sampling(0.0))[0].tolist()
    assert greedy[0] == 0.0 and all(v == -math.inf for v in greedy[1:])
    top1 = tempered_logprobs(logits, Sampling(1.0, top_k=1))[0].tolist()
    assert top1[0] == 0.0 and top1[1] == -math.inf


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7), Sampling(0.7, top_p=0.8), Sampling(1.0, top_k=2),
                                      Sampling(0.0)], ids=["plain", "tempered", "nucleus", "top-k", "greedy"])
def test_the_picked_log_probabilities_are_the_full_distributions_at_those_ids(sampling):
    import torch

    logits = torch.randn((5, 300), generator=torch.Generator().manual_seed(7)) * 4
    picks = [[0, 17], [], [299, 3, 3], [int(logits[3].argmax())], [5]]
    full = tempered_logprobs(logits, sampling)
    got = picked_logprobs(logits, sampling, picks)
    assert [len(g) for g in got] == [len(p) for p in picks]
    for k, (row, want) in enumerate(zip(got, picks)):
        for v, i in zip(row, want):
            ref = float(full[k, i])
            assert v == ref if math.isinf(ref) else math.isclose(v, ref, rel_tol=1e-6, abs_tol=1e-5)


def test_branches_on_the_cached_prefix_score_exactly_like_full_forwards(lm, ids):
    sampling = Sampling(0.7, top_p=0.95)
    scorer = HFScorer(lm.model, sampling)
    scorer.score(ids, 1)
    branches = [(4, ids[4:9]), (6, [ids[6], 300, 301]), (9, [ids[9]])]
    got = scorer.score_branches(ids, branches)
    # One pass for the base, one tree-masked pass for every branch together.
    assert scorer.counters.forwards == 2
    for (at, tail), lps in zip(branches, got):
        plain = full(lm, sampling).score(ids[:at] + list(tail), at).logprobs
        assert all((a == b == -math.inf) or abs(a - b) < 1e-4 for a, b in zip(lps, plain))


def test_trie_nodes_score_like_full_forwards_and_a_shared_prefix_is_forwarded_once(lm, ids, flat):
    sampling = Sampling(0.7, top_p=0.95)
    scorer = HFScorer(lm.model, sampling)
    scorer.flat = flat
    scorer.score(ids, 1)
    # Two windows through the node (4, [ids[4]]), one of them a level deeper, and another branch.
    nodes = [(4, [ids[4]], [ids[5], 300]), (4, [ids[4], ids[5]], [ids[6]]), (6, [300, 301], [ids[8], 5])]
    got = scorer.score_nodes(ids, nodes)
    assert scorer.counters.tokens == len(ids) + 4            # 4 distinct prefixes, each forwarded once
    deeper = scorer.score_nodes(ids, [(4, [ids[4], ids[5], ids[6]], [ids[7]])])
    assert scorer.counters.tokens == len(ids) + 5            # its ancestors stayed in the cache
    for (at, path, ask), lps in zip(nodes + [(4, [ids[4], ids[5], ids[6]], [ids[7]])], got + deeper):
        for a, v in zip(ask, lps):
            plain = full(lm, sampling).score(ids[:at] + list(path) + [a], at + len(path)).logprobs[-1]
            assert (v == plain == -math.inf) or abs(v - plain) < 1e-4
    # Other uses of the cache drop the trie first: a branch and a new base still score exactly.
    assert_branches_like_full(scorer, lm, sampling, ids, 4, [ids[4], 300])


def test_an_engine_scores_a_trie_node_with_one_request_for_all_its_asked_tokens(lm, ids):
    sampling = Sampling(1.0)
    with loopback(local_route(lm)) as url:
        scorer = VllmScorer(url, lm.name, sampling)
        got = scorer.score_nodes(ids, [(4, [ids[4], ids[5]], [ids[6], ids[7]]), (5, [300], [])])
    # One request per node; a node that asks nothing is sent for its path's values alone.
    assert scorer.counters.forwards == 2 and got[1] == []
    exact = HFScorer(lm.model, sampling).score_nodes(ids, [(4, [ids[4], ids[5]], [ids[6], ids[7]])])[0]
    assert got[0] == pytest.approx(exact, abs=0.05)
    # The request carried the path, so its tokens' values come back exact, whatever their rank.
    path = HFScorer(lm.model, sampling).score_branches(ids, [(4, [ids[4], ids[5]]), (5, [300])])
    assert got[0].path == pytest.approx(path[0], abs=1e-4) and got[1].path == pytest.approx(path[1], abs=1e-4)


def test_a_base_that_shares_a_prefix_with_the_last_is_scored_from_where_they_differ(lm, ids, flat):
    sampling = Sampling(1.0)
    scorer = HFScorer(lm.model, sampling)
    scorer.flat = flat
    scorer.score(ids, 1)
    edited = ids[:7] + [300, 301] + ids[8:]
    again = scorer.score(edited, 2, [[5]] * (len(edited) - 2))
    assert scorer.counters.tokens == len(ids) + len(edited) - 7          # the shared 7 tokens ran once
    fresh = full(lm, sampling).score(edited, 2, [[5]] * (len(edited) - 2))
    assert max(abs(a - b) for a, b in zip(again.logprobs, fresh.logprobs)) < 1e-4
    assert max(abs(a[5] - b[5]) for a, b in zip(again.asked, fresh.asked)) < 1e-4


def test_rows_scored_in_one_padded_batch_score_like_each_alone_and_branch_on_their_own_cache(lm, ids):
    sampling = Sampling(0.7)
    rows = [(ids, 3, None), (ids[:9], 2, [[5]] * 7), (ids[2:], 1, None)]
    scorer = HFScorer(lm.model, sampling)
    batched = scorer.score_rows(rows)
    assert scorer.counters.forwards == 1
    for (row, start, ask), got in zip(rows, batched):
        alone = full(lm, sampling).score(row, start, ask)
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) < 1e-4
        assert all(abs(a[k] - b[k]) < 1e-4 for a, b in zip(got.asked, alone.asked) for k in a)
    short = ids[:9]
    assert_branches_like_full(scorer, lm, sampling, short, 4, [300, 301])
    assert scorer.counters.forwards == 2                                 # no second pass over the row


def test_a_trie_that_outgrows_its_rows_room_still_scores_like_full_forwards(lm, ids, flat):
    # A cached row keeps ROW_ROOM free columns for its trie and grows its buffers past them: nodes
    # appended before, across and after the growth, in rounds of several rows and of one, and a
    # branch forward that appends then crops, must all score as full forwards do.
    from draftgate.repair.score import ROW_ROOM

    sampling = Sampling(1.0)
    rows = [ids, ids[:9]]
    scorer = batched(lm, sampling, rows, flat)
    chains = [(ids, 3, [100 + j for j in range(ROW_ROOM + 10)]), (ids[:9], 5, [200 + j for j in range(12)])]
    for a in range(0, ROW_ROOM + 10, 30):
        scorer.score_nodes_many([(base, [(at, path[:b], [7]) for b in range(a + 1, min(a + 30, len(path)) + 1)])
                                 for base, at, path in chains if a < len(path)])
    assert scorer._rows[tuple(ids)].cache.get_seq_length() == len(ids) + ROW_ROOM + 10
    for base, at, path in chains:
        picks = [max(1, len(path) // 2), len(path)]
        got = scorer.score_nodes(base, [(at, path[:b], [7]) for b in picks])
        for b, (v,) in zip(picks, got):
            plain = full(lm, sampling).score(base[:at] + path[:b] + [7], at + b).logprobs[-1]
            assert abs(v - plain) < 1e-4
    assert_branches_like_full(scorer, lm, sampling, ids, 2, [ids[2], 300, 301])


def test_several_rows_trie_rounds_are_one_forward_and_score_like_each_row_alone(lm, ids, flat):
    sampling = Sampling(0.7, top_p=0.95)
    rows = [ids, ids[:9], ids[2:]]
    scorer = batched(lm, sampling, rows, flat)
    asks = [(ids, [(4, [ids[4]], [ids[5], 300]), (4, [ids[4], ids[5]], [ids[6]])]),
            (ids[:9], [(6, [300, 301], [5, ids[8]])]),
            (ids[2:], [(3, [ids[5]], [ids[6]])])]
    got = scorer.score_nodes_many(asks)
    assert scorer.counters.forwards == 2                     # the batch's base pass, then one round for all
    deeper = scorer.score_nodes_many([(ids, [(4, [ids[4], ids[5], 7], [9])]), (ids[:9], [(6, [300, 301, 5], [2])])])
    # Unpadded, a forward counts its 5 + 2 new nodes; padded, each row as wide as the widest.
    assert scorer.counters.forwards == 3
    assert scorer.counters.tokens == 3 * len(ids) + ((5 + 2) if flat else (3 * 2 + 2 * 1))
    for (base, nodes), lps in zip(asks + [(ids, [(4, [ids[4], ids[5], 7], [9])]), (ids[:9], [(6, [300, 301, 5], [2])])],
                                  got + deeper):
        alone = full(lm, sampling)
        alone.score(base, 1)
        exact = alone.score_nodes(base, nodes)
        assert all(a == b == -math.inf or abs(a - b) < 1e-4 for x, y in zip(lps, exact) for a, b in zip(x, y))
        assert [len(x) for x in lps] == [len(ask) for _, _, ask in nodes]


def test_several_rows_next_bases_are_one_forward_from_where_each_leaves_its_old_base(lm, ids, flat):
    sampling = Sampling(1.0)
    old = [ids, ids[:10]]
    scorer = batched(lm, sampling, old, flat)
    new = [ids[:5] + [300] + ids[6:], ids[:8] + [301, 302]]
    got = scorer.score_many([(n, 2, None, o) for n, o in zip(new, old)])
    assert scorer.counters.forwards == 2
    # Each from its first difference (5 and 8); padded, both as long as the longer rest.
    assert scorer.counters.tokens == 2 * len(ids) + ((len(ids) - 5) + (len(new[1]) - 8) if flat else 2 * (len(ids) - 5))
    for n, g in zip(new, got):
        fresh = full(lm, sampling).score(n, 2).logprobs
        assert max(abs(a - b) for a, b in zip(g.logprobs, fresh)) < 1e-4
    # The old bases stay as they were, for any other search on them.
    assert_branches_like_full(scorer, lm, sampling, ids, 4, [300, 301])


def test_several_rows_branches_are_one_forward_and_leave_each_rows_cache_at_its_base(lm, ids, flat):
    sampling = Sampling(1.0)
    rows = [ids, ids[:9]]
    scorer = batched(lm, sampling, rows, flat)
    scorer.score_nodes(ids, [(3, [300, 301], [5])])           # a trie on the row, dropped first
    asks = [(ids, [(4, ids[4:9]), (6, [ids[6], 300, 301]), (9, [ids[9]])]), (ids[:9], [(2, [302, 303])])]
    before = scorer.counters.forwards
    got = scorer.score_branches_many(asks)
    assert scorer.score_branches_many([(ids, [])]) == [[]]                 # nothing asked, nothing scored
    # Unpadded: one forward for both rows; padded: one a row.
    assert scorer.counters.forwards - before == (1 if flat else 2)
    for (base, branches), lps in zip(asks, got):
        for (at, tail), lp in zip(branches, lps):
            plain = full(lm, sampling).score(base[:at] + list(tail), at).logprobs
            assert max(abs(a - b) for a, b in zip(lp, plain)) < 1e-4
    for base in rows:                                          # each cache holds its base again
        assert scorer._rows[tuple(base)].cache.get_seq_length() == len(base)
    node = scorer.score_nodes(ids, [(5, [304], [7])])[0][0]
    assert abs(node - full(lm, sampling).score(ids[:5] + [304, 7], 6).logprobs[-1]) < 1e-4


def test_a_qwen3_decoder_runs_unpadded_like_its_own_forward_and_a_sliding_window_one_takes_its_own(lm):
    # The embedded target (Llama) runs its cached rows by the decoder's parts. So does a Qwen3 (its
    # per-head q/k norms): a small one with random weights scores nodes and a next base as its own
    # forward does. A decoder with a sliding window is left to its own forward.
    import torch
    from transformers import MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM

    assert HFScorer(lm.model, Sampling(1.0)).flat
    torch.manual_seed(0)
    small = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16)
    qwen = Qwen3ForCausalLM(Qwen3Config(**small)).eval()
    row = [(7 * k) % 500 + 3 for k in range(40)]
    scorer, reference = HFScorer(qwen, Sampling(1.0)), HFScorer(qwen, Sampling(1.0))
    reference.flat = False
    assert scorer.flat
    scorer.score(row, 1)
    nodes = [(4, [row[4]], [5, 6]), (4, [row[4], 300], [7]), (9, [301], [row[10]])]
    for (at, path, ask), lps in zip(nodes, scorer.score_nodes(row, nodes)):
        for a, v in zip(ask, lps):
            assert abs(v - reference.score(row[:at] + path + [a], at + len(path)).logprobs[-1]) < 1e-4
    edited = row[:6] + [302] + row[7:]
    assert max(abs(a - b) for a, b in zip(scorer.score(edited, 2, replace=row).logprobs,
                                          reference.score(edited, 2).logprobs)) < 1e-4
    mistral = MistralForCausalLM(MistralConfig(sliding_window=8, **small)).eval()
    assert not HFScorer(mistral, Sampling(1.0)).flat


def test_asked_alternatives_come_from_the_same_pass(lm, ids):
    scorer = HFScorer(lm.model, Sampling(1.0))
    s = scorer.score(ids, 2, ask=[[ids[2], 5]] + [[]] * (len(ids) - 3))
    assert s.asked[0][ids[2]] == pytest.approx(s.logprobs[0])
    assert set(s.asked[0]) == {ids[2], 5} and s.asked[1] == {}


def test_tempering_top_k_raw_logprobs_is_exact_when_the_top_k_hold_the_mass():
    raw = RawPosition(token=1, logprob=math.log(0.3), rank=2, top={0: math.log(0.7), 1: math.log(0.3)})
    t = temper(raw, Sampling(0.5), [0])
    z = 0.7 ** 2 + 0.3 ** 2
    assert t[1] == pytest.approx(math.log(0.3 ** 2 / z)) and t[0] == pytest.approx(math.log(0.7 ** 2 / z))
    # top_p 0.8 at T=0.5: token 0 alone holds 0.845 of the tempered mass; token 1 is outside.
    assert temper(raw, Sampling(0.5, top_p=0.8))[1] == -math.inf
    assert temper(raw, Sampling(1.0, top_k=1))[1] == -math.inf


def test_a_token_below_the_engines_top_k_is_bounded_by_the_kth_unless_it_cannot_be_drawn():
    # The top 2 of a position hold 0.6 and 0.2; token 7 is not in the answer, so it is at most 0.2.
    raw = RawPosition(token=0, logprob=math.log(0.6), rank=1, top={0: math.log(0.6), 1: math.log(0.2)})
    t = temper(raw, Sampling(1.0), [1, 7])
    assert isinstance(t[7], Bound) and t[7] == pytest.approx(t[1]) and not isinstance(t[1], Bound)
    assert t[7] == pytest.approx(math.log(0.2))
    # And at most the mass the top k leave, where that is less: 0.05 beside a k-th of 0.15.
    peaked = RawPosition(token=0, logprob=math.log(0.8), rank=1, top={0: math.log(0.8), 1: math.log(0.15)})
    assert temper(peaked, Sampling(1.0), [7])[7] == pytest.approx(math.log(0.05))
    # Outside what could be sampled it is -inf, not a bound: the top 2 fill top_k 2, or reach top_p.
    assert temper(raw, Sampling(1.0, top_k=2), [7])[7] == -math.inf
    assert temper(raw, Sampling(1.0, top_p=0.75), [7])[7] == -math.inf
    # Inside a nucleus the top k do not fill, the bound is renormalised as an inside token is.
    inside = temper(raw, Sampling(1.0, top_p=0.9), [1, 7])
    assert isinstance(inside[7], Bound) and inside[7] == pytest.approx(inside[1])


# ---------------------------------------------------------------- over HTTP

@contextlib.contextmanager
def loopback(handle):
    """A local HTTP server whose POST bodies go to handle(path, body) -> (status, json)."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, answer = handle(self.path, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def local_route(lm):
    from draftgate.serve.score import RouteError, score_completions_request

    def handle(path, body):
        assert path == "/v1/completions"
        try:
            return 200, score_completions_request(lm, body)
        except RouteError as e:
            return e.status, e.body()
    return handle


def sglang_from(lm, shift: int = 0):
    """SGLang's /generate answer, built from the local route's vLLM-shaped one (scripted shape)."""
    from draftgate.serve.score import score_completions_request

    def handle(path, body):
        assert path == "/generate" and body["sampling_params"]["max_new_tokens"] == 0
        ids, start, k = body["input_ids"], body["logprob_start_len"], body["top_logprobs_num"]
        v = score_completions_request(lm, {"prompt": ids, "prompt_logprobs": k, "max_tokens": 1})
        entries = v["choices"][0]["prompt_logprobs"]
        tokens, tops = [], []
        for pos in range(start + shift, len(ids)):
            e = entries[pos]
            if e is None:
                tokens.append([None, ids[pos], None])
                tops.append(None)
                continue
            tokens.append([e[str(ids[pos])]["logprob"], ids[pos], None])
            ranked = sorted(((x["logprob"], int(t), None) for t, x in e.items() if x["rank"] <= k), reverse=True)
            tops.append([list(r) for r in ranked])
        return 200, {"text": "", "meta_info": {"id": "x", "prompt_tokens": len(ids), "completion_tokens": 0,
                                               "input_token_logprobs": tokens, "input_top_logprobs": tops}}
    return handle


def test_the_local_servers_scoring_route_answers_in_vllms_shape(lm, ids):
    with loopback(local_route(lm)) as url:
        scorer = VllmScorer(url, lm.name, Sampling(1.0))
        got = scorer.score(ids, 1).logprobs
        bad = VllmScorer(url, lm.name, Sampling(1.0))
        bad.request_body = lambda i, name=None: {"prompt": "text", "prompt_logprobs": 1, "max_tokens": 1}
        with pytest.raises(ScoreError, match="list of token ids"):
            bad.score(ids, 1)
    # At temperature 1 with no nucleus the raw logprobs ARE the answer: equal to the in-process ones.
    exact = HFScorer(lm.model, Sampling(1.0)).score(ids, 1).logprobs
    assert got == pytest.approx(exact, abs=1e-4)


def test_vllm_and_sglang_backends_agree_with_the_target_at_the_sampling_temperature(lm, ids):
    sampling = Sampling(0.7)
    exact = HFScorer(lm.model, sampling).score_branches(ids, [(5, ids[5:])])[0]
    with loopback(local_route(lm)) as url:
        vllm = VllmScorer(url, lm.name, sampling).score_branches(ids, [(5, ids[5:])])[0]
    with loopback(sglang_from(lm)) as url:
        sglang = SglangScorer(url, None, sampling).score_branches(ids, [(5, ids[5:])])[0]
    # Tempered from the raw top 20 (score.py: the tail approximation): close, not exact.
    assert vllm == pytest.approx(exact, abs=0.05)
    assert sglang == pytest.approx(vllm, abs=1e-6)


def test_an_engine_answer_that_is_off_by_one_position_is_refused_by_name(lm, ids):
    with loopback(sglang_from(lm, shift=1)) as url:
        with pytest.raises(ScoreError, match="positions 3"):
            SglangScorer(url, None, Sampling(1.0)).score(ids, 3)
