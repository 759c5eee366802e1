"""`draftgate lineage`: the chain of stages behind an artifact, read from dvc.lock and the stage files
of a real git + DVC repository (tests/dvc_repo.py: contract -> generate -> reconstruct -> gate_tokens
-> train, two commits and an experiment)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import yaml

from dvc_repo import Repo, env, history_copy
from draftgate.lineage import lineage as lineage_mod
from draftgate.lineage.facts import identity
from draftgate.lineage.lineage import lineage, render
from draftgate.lineage.pipeline import Pipeline


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Repo:
    return history_copy(tmp_path_factory, "lineage")


def lock(repo: Repo) -> dict:
    return yaml.safe_load((repo.root / "dvc.lock").read_text())


def test_the_drafter_lists_every_upstream_stage_with_the_hashes_dvc_lock_records(repo):
    result = lineage("data/drafter/model.txt", repo.root)
    assert result["stage"] == "train"
    assert [s["stage"] for s in result["stages"]] == ["train", "gate_tokens", "reconstruct", "generate", "contract"]
    stages = lock(repo)["stages"]
    drafter_dir = next(o for o in stages["train"]["outs"] if o["path"] == "data/drafter")
    assert result["out"] == "data/drafter" and result["out_md5"] == drafter_dir["md5"]
    model = (repo.root / "data" / "drafter" / "model.txt").read_bytes()
    assert result["md5"] == hashlib.md5(model).hexdigest()        # its own entry in the folder's listing
    assert result["workspace_matches_lock"] is True
    by_stage = {s["stage"]: s for s in result["stages"]}
    tokens_in = next(d for d in by_stage["train"]["deps"] if d["path"] == "data/tokens")
    assert tokens_in["from"] == "reconstruct"
    assert tokens_in["md5"] == next(o["md5"] for o in stages["reconstruct"]["outs"] if o["path"] == "data/tokens")
    assert by_stage["reconstruct"]["params"]["reconstruct.method"] == "text"
    assert by_stage["generate"]["params"] == {"generate.n": 8, "generate.temperature": 0.7, "generate.backend": "local",
                                              "generate.model": "tiny"}


def test_identity_spend_commit_and_gate_verdicts_come_from_the_stage_files(repo):
    result = lineage("data/drafter/model.txt", repo.root)
    contract = repo.json("data/contract/contract.json")
    manifest = repo.json("data/drafter/manifest.json")
    assert result["identity"] == {"tokenizer": contract["tokenizer"]["fingerprint"],
                                  "template": contract["template_contract"]["official"]["sha256"],
                                  "weights": manifest["weights_fingerprint"]}
    gen = result["generation"]
    assert (gen["backend"], gen["model"], gen["providers"], gen["spent_usd"], gen["wasted_usd"]) == \
        ("local", "tiny", {"local": 8}, 0.008, 0.0)
    head = repo.run("git", "rev-parse", "HEAD").stdout.strip()
    assert result["revision"]["commit"] == head and result["revision"]["uncommitted"] == []
    [gate] = result["gates"]
    suite_sha = hashlib.sha256((repo.root / "expectations" / "tokens.json").read_bytes()).hexdigest()
    assert (gate["gate"], gate["success"], gate["checks"], gate["failed"], gate["suite_sha256"]) == \
        ("gate_tokens", True, 2, 0, suite_sha)
    assert gate["figures"]["dataset_mismatch_rate.max"] == 0.25


def test_the_template_fingerprint_is_the_chat_templates_never_a_gate_suites():
    # The real pipeline walks gate_template (whose record holds its suite's sha256) before the
    # contract: a pick by file name took the suite's hash for the chat template's.
    chat_template, suite = "872be49d" + "0" * 56, "db32f329" + "0" * 56
    fps = {"data/gates/template.details.json#suite_sha256": suite,
           "data/gates/tokens.details.json#suite_sha256": "ab" * 32,
           "data/contract/contract.json#template_contract.official.hooks_sha256": "cd" * 32,
           "data/contract/contract.json#template_contract.official.sha256": chat_template,
           "data/contract/contract.json#tokenizer.fingerprint": "ef" * 32}
    assert identity(fps) == {"tokenizer": "ef" * 32, "template": chat_template}


def test_an_export_folder_inside_the_drafter_has_the_hash_dvc_gives_that_folder(repo, tmp_path):
    result = lineage("data/drafter/sglang", repo.root)
    assert result["stage"] == "train" and result["out"] == "data/drafter"
    # The oracle: DVC itself hashing a copy of the folder.
    scratch = tmp_path / "scratch"
    shutil.copytree(repo.root / "data" / "drafter" / "sglang", scratch / "sglang")
    subprocess.run(["dvc", "init", "-q", "--no-scm"], cwd=scratch, env=env(), check=True)
    subprocess.run(["dvc", "add", "-q", "sglang"], cwd=scratch, env=env(), check=True)
    assert result["md5"] == yaml.safe_load((scratch / "sglang.dvc").read_text())["outs"][0]["md5"]
    assert f"md5 {result['md5'][:8]}.dir (in data/drafter" in render(result)


def test_the_text_tree_names_each_stage_its_inputs_and_the_gate_verdict(repo):
    text = render(lineage("data/drafter", repo.root))
    for line in ("├── train", "in: data/tokens", "← reconstruct", "gate_tokens  PASS 2/2, 8 rows",
                 "params: reconstruct.method=text", "generation: backend local, model tiny, providers local 8",
                 "suite: expectations/tokens.json md5"):
        assert line in text, f"{line!r} missing from\n{text}"


def test_an_old_commit_is_read_from_git_and_its_cached_contract_from_the_dvc_cache(repo):
    tracked = repo.run("git", "ls-files").stdout.split()
    assert "data/contract/contract.json" not in tracked     # DVC caches it; git never saw it
    old = lineage("data/tokens/tokens.jsonl", repo.root, rev="HEAD~1")
    by_stage = {s["stage"]: s for s in old["stages"]}
    assert by_stage["reconstruct"]["params"]["reconstruct.method"] == "auto"
    assert old["revision"]["kind"] == "commit"
    assert old["identity"]["tokenizer"] == repo.json("data/contract/contract.json")["tokenizer"]["fingerprint"]
    assert old["md5"] != lineage("data/tokens/tokens.jsonl", repo.root)["md5"]   # text reconstruction differs


def test_an_experiment_is_named_as_dvc_names_it(repo):
    result = lineage("data/drafter", repo.root, rev="seed3")
    assert result["revision"]["kind"] == "experiment"
    assert {s["stage"]: s for s in result["stages"]}["train"]["params"] == {"train.seed": 3}


def test_the_cli_prints_json_and_exits_2_on_a_path_no_stage_writes(repo):
    cli = [sys.executable, "-m", "draftgate", "lineage"]
    out = subprocess.run([*cli, "data/drafter/model.txt", "--json"], cwd=repo.root, env=env(), capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stage"] == "train"
    bad = subprocess.run([*cli, "data/nowhere.txt"], cwd=repo.root, env=env(), capture_output=True, text=True)
    assert bad.returncode == 2
    assert "no stage of dvc.yaml at workspace writes it" in bad.stderr and "data/drafter" in bad.stderr


def test_a_stage_that_never_ran_is_walked_from_dvc_yaml():
    pipe = Pipeline({"stages": {"a": {"cmd": "x", "outs": ["d/a"]},
                                "b": {"cmd": "draftgate validate s d/a", "deps": ["d/a", "expectations/s.json"],
                                      "metrics": ["data/gates/s.json"]},
                                "c": {"cmd": "y", "deps": ["d/a/f.parquet", "data/gates/s.json"], "outs": ["d/c"]}}},
                    {"stages": {}})
    assert [s.name for s in pipe.upstream("c")] == ["a", "b", "c"]
    assert pipe.stages["b"].is_gate and pipe.stages["b"].suite.path == "expectations/s.json"
    assert not any(s.locked for s in pipe.stages.values())


def test_code_deps_are_told_from_data_by_the_package_they_live_in(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    assert lineage_mod.is_code(tmp_path, "pkg/sub") and lineage_mod.is_code(tmp_path, "stages/x.py")
    assert not lineage_mod.is_code(tmp_path, "data/raw")
