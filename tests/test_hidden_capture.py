"""Capture takes EAGLE-3's tensors from the real SmolLM2: the same values HF reports, at the right indices."""

from __future__ import annotations

import pytest
import torch

from draftgate.config import HiddenParams
from draftgate.hidden.capture import capture, capture_rows, layer_names, padding_fraction, plan_batches
from draftgate.target import eagle3_layers, resolve_layers
from hidden_fixtures import token_rows


@pytest.fixture(scope="module")
def target():
    from draftgate.target import load_target

    return load_target(HiddenParams(), device="cpu")


@pytest.fixture(scope="module")
def rows(smollm2_tok):
    return [torch.tensor(r["input_ids"]) for r in token_rows(smollm2_tok, 4)]


def test_eagle3_default_layers_for_smollm2_are_1_14_26_and_hf_2_15_27():
    assert eagle3_layers(30) == (1, 14, 26)
    names = layer_names((1, 14, 26), 30)
    assert names["hf_hidden_states"] == [2, 15, 27] and names["sglang_vllm"] == [2, 15, 27]


def test_layer_params_out_of_range_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="0-based"):
        resolve_layers([1, 14, 30], 30)
    assert resolve_layers(None, 30) == (1, 14, 26)


def test_aux_equals_hf_hidden_states_at_layer_plus_one(target, rows):
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(r) for r in rows], batch_first=True)
    aux, final = capture(target, ids, mask, (1, 14, 26))
    with torch.inference_mode():
        hs = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert aux.shape == (len(rows), ids.shape[1], 3, 576) and final.shape == (len(rows), ids.shape[1], 576)
    for j, layer in enumerate((1, 14, 26)):
        assert torch.equal(aux[:, :, j], hs[layer + 1])
    # HF's last entry is after the final norm; ours is before it, and the norm maps one onto the other.
    assert not torch.allclose(final, hs[30])
    assert torch.equal(target.norm(final), hs[30])


def test_final_is_the_last_layer_output_before_the_norm(target, rows):
    ids, mask = rows[0][None], torch.ones_like(rows[0])[None]
    _, final = capture(target, ids, mask, (1, 14, 26))
    norm = target.base.norm
    target.base.norm = torch.nn.Identity()     # HF's last hidden state is then the pre-norm one
    try:
        with torch.inference_mode():
            pre = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[30]
    finally:
        target.base.norm = norm
    assert torch.equal(final, pre)


def test_logits_from_final_equal_the_models_logits(target, rows):
    ids, mask = rows[1][None], torch.ones_like(rows[1])[None]
    _, final = capture(target, ids, mask, (1, 14, 26))
    with torch.inference_mode():
        logits = target.model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(target.logits_from_final(final), logits.float(), rtol=0, atol=1e-4)


def test_right_padded_rows_equal_each_row_alone(target, rows):
    together = capture_rows(target, rows, (1, 14, 26))
    for r, (aux, final) in zip(rows, together):
        alone_aux, alone_final = capture(target, r[None], torch.ones_like(r)[None], (1, 14, 26))
        assert aux.shape[0] == r.numel()
        # Batch shapes change the matmuls' blocking: last-bit differences that grow over 30 layers
        # to ~1e-4 on states of magnitude ~40. Wrong positions or leaked padding move them by units.
        torch.testing.assert_close(aux, alone_aux[0], rtol=1e-4, atol=5e-4)
        torch.testing.assert_close(final, alone_final[0], rtol=1e-4, atol=5e-4)


def test_batches_sorted_by_length_stay_within_the_token_budget():
    lengths = [50, 200, 48, 199, 120, 51, 10, 300]
    batches = plan_batches(lengths, 400)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 400 for b in batches if len(b) > 1)
    # In table order the same budget pairs 300 with 10 and 200 with 48: sorting wastes far less.
    table_order = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert padding_fraction(lengths, batches) < 0.5 * padding_fraction(lengths, table_order)
    assert padding_fraction(lengths, [[i] for i in range(len(lengths))]) == 0.0


def test_identity_names_the_servers_weights(target):
    from draftgate.serve.model import cached_weights

    assert target.weights_fingerprint == cached_weights().fingerprint
    assert target.identity["num_hidden_layers"] == 30 and target.identity["hidden_size"] == 576
