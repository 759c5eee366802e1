"""End to end: `dvc repro` on throwaway copies of this repository stops at a failed gate.

Apart from tests/test_pipeline.py (whose module-wide repro takes minutes), so that xdist can run
these on the other worker.
"""

from __future__ import annotations

import json

import yaml

from test_pipeline import copy_repo, gate, run, set_params


def small_copy(tmp_path):
    # The seeded corpus's breadth is tests/test_contract_corpus.py's; here the contract only has to run.
    repo = copy_repo(tmp_path)
    set_params(repo, contract={"corpus_size": 60})
    return repo


def test_a_wrong_configured_special_id_stops_the_pipeline_at_the_contract_gate(tmp_path):
    repo = small_copy(tmp_path)
    # The seed run's bug in miniature: an id that is an ordinary token, configured for <|im_end|>.
    tok = yaml.safe_load((repo / "params.yaml").read_text())["tokenizer"]
    set_params(repo, tokenizer={**tok, "expected_ids": {"<|im_end|>": 1000}})
    out = run(["dvc", "repro"], repo, check=False)
    assert out.returncode != 0
    assert gate(repo, "contract")["success"] is False
    assert "expected" in json.dumps(json.loads((repo / "data" / "contract" / "contract.json").read_text()))
    assert not (repo / "data" / "prompts").exists()


def test_a_failed_gate_stops_repro_before_the_next_stage(tmp_path):
    repo = small_copy(tmp_path)
    # One unusable record, and a gate that tolerates no rejects.
    with open(repo / "data" / "raw" / "chat.jsonl", "a") as f:
        f.write('{"messages": [{"role": "narrator", "content": "hi"}]}\n')
    set_params(repo, gates={**yaml.safe_load((repo / "params.yaml").read_text())["gates"],
                            "prompts": {"max_rejects_rate": 0.0, "min_heldout_fraction": 0.03,
                                        "max_heldout_fraction": 0.25}})
    out = run(["dvc", "repro"], repo, check=False)
    assert out.returncode != 0
    assert gate(repo, "prompts")["success"] is False
    assert not (repo / "data" / "responses" / "responses.parquet").exists()
