"""Params whose bounds need the target: refused where the target is first known, naming the key."""

from __future__ import annotations

import json

import pytest

from draftgate.config import parse_params


def test_a_draft_vocabulary_larger_than_the_targets_is_refused_before_training_loads_anything(tmp_path, smollm2_tok):
    from draftgate.drafter.run import RunError, setup
    from draftgate.hidden.shards import FORMAT, MANIFEST

    # The manifest as the hidden stage writes it names the target's vocabulary (model.vocab_size).
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / MANIFEST).write_text(json.dumps({"format": FORMAT, "model": {"vocab_size": smollm2_tok.vocab_size}}))
    params = parse_params({"drafter": {"draft_vocab_size": 60_000, "device": "cpu"}})
    with pytest.raises(RunError) as e:
        setup(params, hidden, tmp_path / "no-tokens.parquet")     # refused before the tokens are read
    assert str(e.value).startswith("drafter.draft_vocab_size 60000 is larger than the target's vocabulary of 49152 ids")


def test_a_layer_past_the_targets_count_is_refused_with_the_key_and_the_count():
    from draftgate.target import resolve_layers
    from draftgate.target import TargetError, load_target

    hp = parse_params({"hidden": {"layers": [1, 14, 30], "device": "cpu"}}).hidden   # the params allow it ...
    with pytest.raises(TargetError) as e:                                          # ... SmolLM2-135M does not
        load_target(hp)
    assert str(e.value).startswith("hidden.layers [1, 14, 30]: layer 30 is past the target's 30 decoder layers")
    with pytest.raises(ValueError, match=r"need 3 decoder-layer ids in \[0, 29\].*the target has 30 layers"):
        resolve_layers(hp.layers, 30)        # the hidden stage's check with the loaded model says the same


def test_an_hf_dir_targets_layer_count_is_checked_from_its_config_before_any_weight_loads(tmp_path):
    from draftgate.config import HiddenParams
    from draftgate.target import TargetError, load_target

    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 61}}))
    (tmp_path / "model.safetensors").write_bytes(b"")     # would fail to load: the check comes first
    hp = HiddenParams(kind="hf_dir", path=str(tmp_path), layers=[2, 29, 61], device="cpu")
    with pytest.raises(TargetError) as e:
        load_target(hp)
    assert str(e.value).startswith("hidden.layers [2, 29, 61]: layer 61 is past the target's 61 decoder layers")
