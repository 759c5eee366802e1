"""Speculative decoding with the real SmolLM2 target is lossless, and the proposers behave as named.

Greedy speculative output must equal plain greedy output token for token for every proposer;
the oracle (the target drafting for itself) has every draft accepted, random drafts almost none.
"""

from __future__ import annotations

import pytest

from eval_fixtures import PROMPTS, chat_prompt, random_drafter

K = 3
NEW = 20


@pytest.fixture(scope="module")
def target():
    from draftgate.config import HiddenParams
    from draftgate.target import load_target

    return load_target(HiddenParams(device="cpu"))


@pytest.fixture(scope="module")
def end_ids(smollm2_tok):
    from draftgate.serve.model import resolve_end_ids

    return resolve_end_ids(smollm2_tok.hf)


@pytest.fixture(scope="module")
def prompts(smollm2_tok):
    return [chat_prompt(smollm2_tok, t) for t in PROMPTS[:2]]


@pytest.fixture(scope="module")
def greedy(target, prompts, end_ids):
    from draftgate.evaluate.loop import greedy_decode

    return [greedy_decode(target.model, "cpu", p, NEW, end_ids) for p in prompts]


def decode(target, prompts, end_ids, proposer, aux_layers=None):
    from draftgate.evaluate.loop import speculative_decode

    return [speculative_decode(target.model, "cpu", p, proposer, K, NEW, end_ids, aux_layers) for p in prompts]


def proposer(name, target):
    from draftgate.evaluate.proposers import Eagle3Proposer, NgramProposer, OracleProposer, RandomProposer

    if name == "oracle":
        return OracleProposer(target.model, "cpu"), None
    if name == "random":
        return RandomProposer(target.vocab_size, seed=0), None
    if name == "ngram":
        return NgramProposer(1, 3), None
    drafter = random_drafter(target)
    return Eagle3Proposer(drafter), drafter.config.aux_layers


@pytest.mark.parametrize("name", ["oracle", "random", "ngram", "eagle3_untrained"])
def test_speculative_output_equals_greedy_output(name, target, prompts, end_ids, greedy):
    p, layers = proposer(name, target)
    for got, want in zip(decode(target, prompts, end_ids, p, layers), greedy):
        assert got.ids == want.ids
        assert got.finish == want.finish
        assert 1 + sum(got.emitted) == len(got.ids)


def test_the_oracle_has_every_draft_token_accepted(target, prompts, end_ids):
    p, _ = proposer("oracle", target)
    for d in decode(target, prompts, end_ids, p):
        assert d.accepted[:-1] == [K] * (len(d.accepted) - 1)
        assert d.emitted[:-1] == [K + 1] * (len(d.emitted) - 1)
        assert len(d.emitted) == -(-(len(d.ids) - 1) // (K + 1))     # ceil: only the last step is short


def test_random_drafts_are_almost_never_accepted(target, prompts, end_ids):
    from draftgate.evaluate.stats import PromptSteps, accepted_fraction

    p, _ = proposer("random", target)
    runs = decode(target, prompts, end_ids, p)
    steps = [PromptSteps(d.drafted, d.accepted, d.emitted) for d in runs]
    assert accepted_fraction(steps) < 0.05
    assert all(len(d.emitted) == len(d.ids) - 1 for d in runs)        # one token per forward


def test_the_end_token_stops_decoding_and_is_kept(target, smollm2_tok, end_ids):
    from draftgate.evaluate.loop import speculative_decode

    prompt = chat_prompt(smollm2_tok, "Say hello.")
    d = speculative_decode(target.model, "cpu", prompt, proposer("oracle", target)[0], K, 200, end_ids)
    assert d.finish == "stop" and d.ids[-1] in end_ids and len(d.ids) < 200
    assert not any(t in end_ids for t in d.ids[:-1])


def test_rolling_the_cache_back_gives_the_logits_of_a_fresh_forward(target, prompts):
    import torch

    from draftgate.evaluate.loop import Session

    prompt = prompts[0]
    with torch.inference_mode(), Session(target.model, "cpu") as s:
        s.forward(prompt)
        s.forward([11, 12, 13, 14])                  # a draft, then all but the first rejected
        s.rollback(len(prompt) + 1)
        after, _ = s.forward([99])
    with torch.inference_mode(), Session(target.model, "cpu") as fresh:
        want, _ = fresh.forward(prompt + [11, 99])
    assert torch.allclose(after[-1], want[-1], atol=1e-4)
    assert int(after[-1].argmax()) == int(want[-1].argmax())


def test_the_drafter_sees_the_targets_features_of_exactly_the_accepted_positions(target, prompts, end_ids):
    import torch

    from draftgate.evaluate.loop import speculative_decode
    from draftgate.evaluate.proposers import Eagle3Proposer
    from draftgate.hidden.capture import capture

    drafter = random_drafter(target)
    seen = []

    class Recording(Eagle3Proposer):
        def propose(self, ids, aux, k):
            seen.append((list(ids), aux.clone()))
            return super().propose(ids, aux, k)

    p = Recording(drafter)
    p.propose([0, 0], torch.zeros(1, 3, target.hidden_size), 1)    # the drafter accepts this shape
    seen.clear()
    speculative_decode(target.model, "cpu", prompts[0], p, K, NEW, end_ids, drafter.config.aux_layers)
    ids, aux = seen[-1]
    assert aux.shape[0] == len(ids) - 1
    want, _ = capture(target, torch.tensor([ids[:-1]]), torch.ones(1, len(ids) - 1, dtype=torch.long),
                      drafter.config.aux_layers)
    assert torch.allclose(aux, want[0].float(), atol=2e-3, rtol=1e-3)


def test_replaying_the_ngram_rule_over_verified_ids_gives_the_real_steps(target, prompts, end_ids):
    from draftgate.evaluate.ngram import replay

    for p, d in zip(prompts, decode(target, prompts, end_ids, proposer("ngram", target)[0])):
        drafted, accepted, emitted = replay(p, d.ids, K, 1, 3)
        assert (drafted, emitted) == (d.drafted, d.emitted)
        assert accepted[:-1] == d.accepted[:-1]       # past the stop a real target may agree further


@pytest.fixture(scope="module")
def three(smollm2_tok):
    return [chat_prompt(smollm2_tok, t) for t in PROMPTS]          # different lengths: left padding


@pytest.fixture(scope="module")
def alone(target, three, end_ids):
    """Each prompt's greedy output, decoded on its own: what every batched decode must give."""
    from draftgate.evaluate.loop import greedy_decode

    return [greedy_decode(target.model, "cpu", p, NEW, end_ids) for p in three]


def test_prompts_decoded_greedily_together_give_each_prompts_own_output(target, three, end_ids, alone):
    from draftgate.evaluate.loop import greedy_decode_batch

    together = greedy_decode_batch(target.model, "cpu", three, NEW, end_ids)
    assert [g.ids for g in together] == [g.ids for g in alone]


@pytest.mark.parametrize("name", ["oracle", "ngram", "eagle3_untrained"])
def test_prompts_decoded_together_give_each_prompts_greedy_output(name, target, three, end_ids, alone):
    from draftgate.evaluate.loop import speculative_decode_batch

    layers = proposer(name, target)[1]
    runs = speculative_decode_batch(target.model, "cpu", three, [proposer(name, target)[0] for _ in three],
                                    K, NEW, end_ids, layers)
    assert [d.ids for d in runs] == [g.ids for g in alone]
    assert all(1 + sum(d.emitted) == len(d.ids) for d in runs)
    if name == "oracle":
        assert all(d.accepted[:-1] == [K] * (len(d.accepted) - 1) for d in runs)


def test_the_cached_eagle3_proposer_drafts_what_the_drafters_own_propose_drafts(target, three, end_ids):
    from draftgate.evaluate.loop import speculative_decode_batch
    from draftgate.evaluate.proposers import Eagle3Proposer

    drafter = random_drafter(target, seed=3)
    calls = []

    class Both(Eagle3Proposer):
        def propose(self, ids, aux, k):
            cached = super().propose(ids, aux, k)
            self.cached = False
            plain = super().propose(ids, aux, k)
            self.cached = True
            calls.append(cached == plain)
            return cached

    speculative_decode_batch(target.model, "cpu", three, [Both(drafter) for _ in three], K, NEW, end_ids,
                             drafter.config.aux_layers)
    assert len(calls) > 10 and all(calls)
