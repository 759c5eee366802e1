"""The embedded target is the local server's model: same weights, same identity, and the stage can
prove from the responses' request hashes that they were served by it."""

from __future__ import annotations

import json
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftgate.client.request import build_body, prompt_from_row, request_hash
from draftgate.config import GenerateParams, HiddenParams
from draftgate.target import TargetError, check_served, load_target


@pytest.fixture(scope="module")
def target():
    return load_target(HiddenParams(), device="cpu")


@pytest.fixture(scope="module")
def server_identity():
    from draftgate.serve.model import load

    lm = load("cpu")
    return dict(lm.identity)


def test_the_target_reports_the_identity_the_local_server_reports(target, server_identity):
    assert {**target.served_identity, "device": "cpu"} == server_identity


def tables(tmp_path, identity, gp):
    prompts = [{"prompt_id": f"p{k}", "dataset": "chat", "messages": json.dumps([{"role": "user", "content": f"q{k}"}]),
                "tools": None, "split": "train", "source": f"chat.jsonl:{k}", "n_duplicates": 0} for k in range(3)]
    hashes = [request_hash(build_body(prompt_from_row(p, "t"), gp), gp.backend, identity) for p in prompts]
    pq.write_table(pa.Table.from_pylist(prompts), tmp_path / "prompts.parquet")
    pq.write_table(pa.table({"prompt_id": [p["prompt_id"] for p in prompts], "request_hash": hashes,
                             "status": ["ok"] * 3}), tmp_path / "responses.parquet")
    return tmp_path / "responses.parquet", tmp_path / "prompts.parquet"


def test_responses_served_by_these_weights_pass_the_check(target, server_identity, tmp_path):
    gp = GenerateParams()
    responses, prompts = tables(tmp_path, server_identity, gp)
    assert check_served(target, responses, prompts, gp)["checked"] == 3


def test_responses_served_by_other_weights_fail_with_the_fix(target, server_identity, tmp_path):
    gp = GenerateParams()
    responses, prompts = tables(tmp_path, {**server_identity, "weights": "0" * 64}, gp)
    with pytest.raises(TargetError, match="not served by these weights.*dvc repro generate"):
        check_served(target, responses, prompts, gp)


def test_responses_from_before_servers_recorded_their_identity_fail_too(target, tmp_path):
    gp = replace(GenerateParams(), temperature=0.0)
    responses, prompts = tables(tmp_path, None, gp)
    with pytest.raises(TargetError, match="predate recorded server identities"):
        check_served(target, responses, prompts, gp)


def test_an_hf_dir_target_loads_any_saved_causal_lm(target, smollm2_tok, tmp_path):
    from draftgate.serve.model import cached_weights

    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(cached_weights().path / name)
    smollm2_tok.hf.save_pretrained(folder)
    hf = load_target(HiddenParams(kind="hf_dir", path=str(folder)), device="cpu")
    assert hf.kind == "hf_dir" and hf.num_layers == 30 and hf.config_sha256 == target.config_sha256
    assert hf.weights_fingerprint != target.weights_fingerprint     # its own recipe: the weight files only
    with pytest.raises(TargetError, match="not an HF model directory"):
        load_target(HiddenParams(kind="hf_dir", path=str(tmp_path / "nowhere")), device="cpu")
