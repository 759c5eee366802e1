"""The drafter's layout: sizes from the target, and training-time test equal to drafting a chain."""

from __future__ import annotations

import json

import pytest
import torch

from draftgate.drafter.model import DrafterConfig, Eagle3Drafter


@pytest.fixture(scope="module")
def smollm2_config():
    from draftgate.serve.model import cached_weights

    return json.loads((cached_weights().path / "config.json").read_text())


@pytest.fixture(scope="module")
def drafter(smollm2_config):
    torch.manual_seed(0)
    m = Eagle3Drafter(DrafterConfig.from_target(smollm2_config, 256, [1, 14, 26]))
    with torch.no_grad():   # weights large enough that every path changes the outputs
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
    ids = torch.arange(256) * 7
    m.set_vocab(ids - torch.arange(256), torch.zeros(49152, dtype=torch.bool).index_fill_(0, ids, True))
    return m.eval()


def test_sizes_and_rope_come_from_the_target_config(smollm2_config):
    c = DrafterConfig.from_target(smollm2_config, 2048, [1, 14, 26])
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (576, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.draft_vocab_size) == (1536, 49152, 2048)
    assert c.rope_parameters["rope_theta"] == 100000.0
    m = Eagle3Drafter(c)
    assert m.midlayer.self_attn.q_proj.weight.shape == (576, 1152)      # input 2H: [embedding, hidden]
    assert m.midlayer.self_attn.k_proj.weight.shape == (192, 1152)
    assert m.fc.weight.shape == (576, 1728) and m.lm_head.weight.shape == (2048, 576)
    assert not m.embed_tokens.weight.requires_grad                     # the target's, frozen


def test_every_ttt_step_equals_the_inference_chain_fed_the_true_tokens(drafter):
    torch.manual_seed(1)
    ids, aux = torch.randint(0, 49152, (1, 24)), torch.randn(1, 24, 3, 576)
    steps = drafter.ttt(aux, ids, 5)
    for t in (3, 10):
        _, chain = drafter.chain(ids[0, :t + 2], aux[0], 5, forced=ids[0, t + 2:t + 6].tolist())
        for i in range(5):
            assert torch.allclose(steps[i][0, t], chain[i], atol=1e-4), (t, i)


def test_restricting_the_query_positions_changes_no_state(drafter):
    torch.manual_seed(2)
    ids, aux = torch.randint(0, 49152, (2, 16)), torch.randn(2, 16, 3, 576)
    full = drafter.ttt(aux, ids, 3)
    qpos = torch.tensor([[2, 5, 9, 9], [0, 7, 8, 15]])
    part = drafter.ttt(aux, ids, 3, query_pos=qpos)
    for i in range(3):
        for b in range(2):
            # Fewer query rows change the matmuls' blocking (last-bit differences, 1e-5 on this
            # CPU at 1 thread); a wrong state or position would move the logits by whole units.
            assert torch.allclose(part[i][b], full[i][b, qpos[b]], rtol=1e-4, atol=1e-4)


def test_propose_drafts_k_ids_of_the_draft_vocabulary(drafter):
    torch.manual_seed(3)
    ids, aux = torch.randint(0, 49152, (12,)), torch.randn(12, 3, 576)
    out = drafter.propose(ids, aux, 4)
    assert len(out) == 4 and all(t % 7 == 0 and t < 256 * 7 for t in out)
    # aux for the last context position is accepted and unused: the same chain.
    assert drafter.propose(ids, aux[:11], 4) == out
    assert drafter.propose(ids, aux, 0) == []
    with pytest.raises(ValueError, match="aux for the first n-1"):
        drafter.propose(ids, aux[:5], 2)
