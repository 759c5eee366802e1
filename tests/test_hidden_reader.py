"""One reader interface: online capture and stored shards yield identical tensors for the same rows."""

from __future__ import annotations

import json

import pytest
import torch

from draftgate.config import HiddenParams
from draftgate.hidden.reader import OfflineFeatures, OnlineFeatures, open_features
from draftgate.hidden.shards import ShardError, read_token_rows
from hidden_fixtures import stage_args, token_rows, write_gate, write_params, write_tokens
from stages import hidden as stage

PARAMS = {"dtype": "bfloat16", "shard_max_mb": 0.5, "batch_tokens": 200}


@pytest.fixture(scope="module")
def work(tmp_path_factory, smollm2_tok):
    work = tmp_path_factory.mktemp("reader")
    write_tokens(work / "tokens.parquet", token_rows(smollm2_tok, 6))
    write_gate(work / "gate.json")
    write_params(work / "offline.yaml", **PARAMS)
    write_params(work / "online.yaml", mode="online", **PARAMS)
    assert stage.main(stage_args(work, work / "offline", work / "offline.yaml")) == 0
    assert stage.main(stage_args(work, work / "online", work / "online.yaml")) == 0
    return work


@pytest.fixture(scope="module")
def target():
    from draftgate.target import load_target

    return load_target(HiddenParams(), device="cpu")


def test_online_mode_writes_a_manifest_and_index_but_no_tensors(work):
    m = json.loads((work / "online" / "manifest.json").read_text())
    assert m["mode"] == "online" and m["shards"] == [] and m["rows"] == 6
    assert sorted(p.name for p in (work / "online").iterdir()) == ["index.parquet", "manifest.json"]
    with pytest.raises(ShardError, match="online-mode manifest"):
        OfflineFeatures(work / "online")


def test_online_and_offline_readers_yield_identical_tensors(work, target):
    hp = HiddenParams(**PARAMS)
    offline = open_features(hp, work / "offline", work / "tokens.parquet")
    online = open_features(hp, work / "online", work / "tokens.parquet", target=target)
    assert isinstance(offline, OfflineFeatures) and isinstance(online, OnlineFeatures)
    assert online.prompt_ids == offline.prompt_ids and online.layers == offline.layers == (1, 14, 26)
    assert online.dtype == offline.dtype == "bfloat16" and online.hidden_size == offline.hidden_size == 576
    for i in reversed(online.order()):      # any order: a row is captured inside its planned batch
        a, b = online[i], offline.get(online.prompt_ids[i])
        assert a.prompt_id == b.prompt_id
        for x, y in ((a.input_ids, b.input_ids), (a.loss_mask, b.loss_mask), (a.aux, b.aux), (a.final, b.final)):
            assert x.dtype == y.dtype and torch.equal(x, y)


def test_online_reader_refuses_another_tokens_table(work, target, smollm2_tok, tmp_path):
    other = write_tokens(tmp_path / "tokens.parquet", token_rows(smollm2_tok, 5))
    with pytest.raises(ShardError, match="another tokens table"):
        open_features(HiddenParams(**PARAMS), work / "online", other, target=target)
    with pytest.raises(ShardError, match="another tokens table"):
        OfflineFeatures(work / "offline", other)


def test_an_offline_index_that_lost_a_row_is_refused(work, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    shutil.copytree(work / "offline", tmp_path / "h")
    index = pq.read_table(tmp_path / "h" / "index.parquet")
    pq.write_table(index.slice(1), tmp_path / "h" / "index.parquet")
    with pytest.raises(ShardError, match="5 lines"):
        OfflineFeatures(tmp_path / "h")


def test_samples_carry_the_tokens_ids_and_mask(work):
    rows = read_token_rows(work / "tokens.parquet")
    features = OfflineFeatures(work / "offline")
    for i in features.order():
        s = features[i]
        assert torch.equal(s.input_ids, torch.from_numpy(rows.input_ids[i]))
        assert s.loss_mask.dtype == torch.bool and int(s.loss_mask.sum()) == int(rows.loss_mask[i].sum())
        assert s.aux.shape == (len(rows.input_ids[i]), 3, 576) and s.final.shape == (len(rows.input_ids[i]), 576)
