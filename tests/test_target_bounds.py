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
    from draftgate.hidden.capture import resolve_layers
    from draftgate.serve.model import cached_weights

    layers = parse_params({"hidden": {"layers": [1, 14, 30]}}).hidden.layers      # the params allow it ...
    n = json.loads((cached_weights().path / "config.json").read_text())["num_hidden_layers"]
    with pytest.raises(ValueError) as e:                                           # ... SmolLM2-135M does not
        resolve_layers(layers, n)
    assert "hidden.layers [1, 14, 30]: need 3 decoder-layer ids in [0, 29]" in str(e.value)
    assert "the target has 30 layers" in str(e.value)
