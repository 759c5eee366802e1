"""Experiments, history and the remote: `dvc exp run -S` reaches every param, `dvc metrics diff` has real
history to compare, queued experiments run in DVC's workers, artifacts push to and pull from the
default local remote. The project's own dvc.yaml and params.yaml are checked as they stand; the DVC
commands run in throwaway repositories (tests/dvc_repo.py)."""

from __future__ import annotations

import configparser
import json
import time
from pathlib import Path

import pytest
import yaml

from dvc_repo import Repo, history_copy
from draftgate.lineage.collect import collect_all
from draftgate.lineage.pipeline import flatten

REPO = Path(__file__).resolve().parents[1]


def declared_params() -> dict[str, list[str]]:
    """stage -> the params.yaml keys it declares (`- section`, `- section.key`, or `- params.yaml: [...]`)."""
    out = {}
    for name, stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items():
        keys = []
        for entry in stage.get("params") or []:
            if isinstance(entry, str):
                keys.append(entry)
            elif isinstance(entry, dict):
                keys += [k for file, ks in entry.items() if file == "params.yaml" for k in (ks or [])]
        out[name] = keys
    return out


def test_every_key_of_params_yaml_is_read_by_some_stage_so_exp_run_S_reruns_something():
    leaves = flatten(yaml.safe_load((REPO / "params.yaml").read_text()))
    declared = [k for keys in declared_params().values() for k in keys]
    unread = sorted(leaf for leaf in leaves if not any(leaf == k or leaf.startswith(k + ".") for k in declared))
    assert not unread, ("params.yaml keys no dvc.yaml stage declares under `params:` (dvc exp run -S would change "
                        f"them and rerun nothing): {unread}")


def test_every_param_a_stage_declares_exists_in_params_yaml():
    leaves = flatten(yaml.safe_load((REPO / "params.yaml").read_text()))
    missing = {stage: k for stage, keys in declared_params().items() for k in keys
               if not any(leaf == k or leaf.startswith(k + ".") for leaf in leaves)}
    assert not missing, f"dvc.yaml declares params that params.yaml lacks (dvc repro fails on them): {missing}"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Repo:
    return history_copy(tmp_path_factory, "experiments")


def test_dvc_metrics_diff_between_two_commits_reports_the_real_change(repo):
    out = json.loads(repo.run("dvc", "metrics", "diff", "HEAD~1", "HEAD", "--json").stdout)
    rate = out["metrics/mismatch.json"]["datasets.all.mismatch_rate"]
    assert (rate["old"], rate["new"]) == (0.0, 0.25)
    assert out["metrics/eval.json"]["acceptance_length"]["new"] == 2.25
    params = json.loads(repo.run("dvc", "params", "diff", "HEAD~1", "HEAD", "--json").stdout)
    assert params["params.yaml"]["reconstruct.method"] == {"old": "auto", "new": "text"}


def test_exp_run_S_reruns_only_the_stages_that_read_the_param(repo):
    before = yaml.safe_load((repo.root / "dvc.lock").read_text())["stages"]
    out = repo.run("dvc", "exp", "run", "-S", "generate.n=4", "-n", "fewer").stdout
    assert "Running stage 'generate'" in out and "Running stage 'contract'" not in out
    revs = {r.run: r for r in collect_all(repo.root)}
    fewer = revs["fewer"]
    assert fewer.params["generate"]["generate.n"] == 4
    outs = {a["path"]: a["md5"] for a in fewer.artifacts if a["stage"] == "contract" and a["role"] == "out"}
    assert outs["data/contract/contract.json"] == before["contract"]["outs"][0]["md5"]
    assert fewer.gates["gate_tokens"]["rows"] == 4
    repo.run("git", "checkout", "-q", "--", ".")
    repo.run("dvc", "checkout", "-q", "--force")


def test_artifacts_push_to_a_local_directory_remote_and_pull_into_a_fresh_clone(repo, tmp_path):
    remote = repo.root.parent / f"{repo.root.name}-remote"
    repo.run("dvc", "remote", "add", "-d", "local", f"../{remote.name}")
    repo.commit("remote")
    repo.run("dvc", "push", "-q")
    assert any(remote.rglob("*"))
    clone = Repo(repo.root.parent / f"{repo.root.name}-clone")         # beside it: ../<remote> resolves the same
    repo.run("git", "clone", "-q", str(repo.root), str(clone.root))
    assert not (clone.root / "data" / "drafter" / "model.txt").exists()
    clone.run("dvc", "pull", "-q")
    for rel in ("data/drafter/model.txt", "data/tokens/tokens.jsonl", "data/contract/contract.json"):
        assert (clone.root / rel).read_bytes() == (repo.root / rel).read_bytes()
    assert "up to date" in clone.run("dvc", "status").stdout


def test_the_project_default_remote_is_a_local_directory_outside_the_repository():
    config = configparser.ConfigParser()
    config.read(REPO / ".dvc" / "config")
    name = config.get("core", "remote")
    url = config.get(f"""'remote "{name}"'""", "url")      # DVC writes the section name quoted
    assert "://" not in url, f"the default remote {name!r} should be a local directory, not {url}"
    where = (REPO / ".dvc" / url).resolve()            # DVC resolves a relative url from .dvc/
    assert REPO.resolve() not in where.parents and where != REPO.resolve()


@pytest.mark.slow
def test_queued_experiments_run_in_parallel_workers_and_join_the_audit(repo):
    repo.run("dvc", "exp", "run", "--queue", "-q", "-S", "train.seed=5,6")      # a grid: two experiments
    repo.run("dvc", "queue", "start", "-j", "2")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status = repo.run("dvc", "queue", "status").stdout
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(2)
    assert status.count("Success") == 2, status
    exps = [r for r in collect_all(repo.root) if r.snap.kind == "experiment"]
    seeds = sorted(r.params["train"]["train.seed"] for r in exps)
    assert {5, 6} <= set(seeds)
