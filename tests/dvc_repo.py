"""A throwaway git + DVC repository with a five-stage pipeline shaped like draftgate's, for the lineage,
audit and report tests: real git, real `dvc repro` / `dvc exp run`, stages of a few lines each.

    contract -> generate -> reconstruct -> gate_tokens -> train

The files follow the project's conventions, so the lineage code reads them as it reads the real
ones: a metric `X.json` with `X.details.json` beside it, a gate's metric written by
draftgate/gates/result.py's `metric()` from a result holding `suite_sha256`, a contract with the
tokenizer and template fingerprints, generation spend in the details, a drafter folder with a
manifest.json holding the weights fingerprint and an export folder inside it (data/drafter/sglang),
and `plots/mismatch.csv`. The gate recomputes the
mismatch rate from the tokens rows (it does not read reconstruct's metric) and exits 1 over its
limit, so `dvc repro` stops there, as a real gate does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

VENV_BIN = Path(sys.executable).parent

PARAMS = {
    "tokenizer": {"kind": "smollm2"},
    "template": {"name": "chatml"},
    "generate": {"n": 8, "temperature": 0.7, "backend": "local", "model": "tiny"},
    "reconstruct": {"method": "auto"},
    "gates": {"tokens": {"max_mismatch_rate": 0.5}},
    "train": {"seed": 0},
}

DVC_YAML = """
stages:
  contract:
    cmd: python tiny.py contract
    deps: [tiny.py]
    params: [tokenizer, template]
    outs:
      - data/contract/contract.json
      - metrics/contract.details.json: {cache: false}
    metrics:
      - metrics/contract.json: {cache: false}
  generate:
    cmd: python tiny.py generate
    deps: [tiny.py]
    params: [generate]
    outs:
      - data/responses
      - metrics/generate.details.json: {cache: false}
    metrics:
      - metrics/generate.json: {cache: false}
  reconstruct:
    cmd: python tiny.py reconstruct
    deps: [tiny.py, data/contract/contract.json, data/responses/responses.jsonl]
    params: [reconstruct, template]
    outs:
      - data/tokens
    metrics:
      - metrics/mismatch.json: {cache: false}
    plots:
      - plots/mismatch.csv: {cache: false, x: dataset, y: mismatch_rate}
  gate_tokens:
    cmd: python tiny.py gate_tokens
    deps: [tiny.py, expectations/tokens.json, data/tokens/tokens.jsonl]
    params: [gates.tokens]
    outs:
      - data/gates/tokens.details.json: {cache: false}
    metrics:
      - data/gates/tokens.json: {cache: false}
  train:
    cmd: python tiny.py train
    deps: [tiny.py, data/tokens, data/gates/tokens.json]
    params: [train]
    outs:
      - data/drafter
    metrics:
      - metrics/eval.json: {cache: false}
    plots:
      - plots/loss.csv: {cache: false, x: step, y: loss}
"""

SUITE = {"name": "tokens", "checks": ["row_count", "mismatch_rate"]}

TINY = r'''
import hashlib, json, sys
from pathlib import Path
import yaml

P = yaml.safe_load(open("params.yaml"))

def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()

def dump(path, obj):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")

def rows(path):
    return [json.loads(line) for line in open(path)]

def write_rows(path, items):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in items))

def contract():
    c = {"tokenizer": {"fingerprint": sha("tokenizer:" + P["tokenizer"]["kind"]), "kind": P["tokenizer"]["kind"]},
         "template_contract": {"official": {"sha256": sha("template:" + P["template"]["name"])}}}
    dump("data/contract/contract.json", c)
    dump("metrics/contract.details.json", {"rows_out": 2, "params": P["template"], **c})
    dump("metrics/contract.json", {"rows_out": 2})

def generate():
    g = P["generate"]
    write_rows("data/responses/responses.jsonl",
               [{"id": i, "text": "answer %d at %s" % (i, g["temperature"])} for i in range(g["n"])])
    figs = {"rows_out": g["n"], "spent_usd": round(0.001 * g["n"], 6), "wasted_usd": 0.0}
    dump("metrics/generate.details.json", {**figs, "params": g, "providers": {"local": g["n"]}})
    dump("metrics/generate.json", figs)

def reconstruct():
    rs = rows("data/responses/responses.jsonl")
    differ = 0 if P["reconstruct"]["method"] == "auto" else max(1, len(rs) // 4)
    write_rows("data/tokens/tokens.jsonl",
               [{"id": r["id"], "ids": [ord(c) for c in r["text"]], "match": "bpe_only" if r["id"] < differ else "exact"}
                for r in rs])
    rate = round(differ / len(rs), 6)
    dump("metrics/mismatch.json", {"datasets": {"all": {"rows": len(rs), "bpe_only": differ, "mismatch_rate": rate,
                                                        "billing_row_agreement": 1.0}}})
    Path("plots").mkdir(exist_ok=True)
    Path("plots/mismatch.csv").write_text("dataset,mismatch_rate\nchat,%s\nall,%s\n" % (rate, rate))

def gate_tokens():
    from draftgate.gates.result import metric
    suite_bytes = Path("expectations/tokens.json").read_bytes()
    rs = rows("data/tokens/tokens.jsonl")
    rate = round(sum(r["match"] != "exact" for r in rs) / len(rs), 6)      # recomputed from the rows
    limit = P["gates"]["tokens"]["max_mismatch_rate"]
    checks = [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1},
               "success": len(rs) >= 1, "observed_value": len(rs)},
              {"type": "expect_column_max_to_be_between", "kwargs": {"column": "dataset_mismatch_rate", "max_value": limit},
               "success": rate <= limit, "observed_value": rate}]
    bad = sum(not c["success"] for c in checks)
    result = {"suite": "tokens", "suite_file": "expectations/tokens.json",
              "suite_sha256": hashlib.sha256(suite_bytes).hexdigest(), "success": bad == 0,
              "statistics": {"evaluated": len(checks), "successful": len(checks) - bad, "unsuccessful": bad},
              "rows": len(rs), "expectations": checks}
    dump("data/gates/tokens.details.json", result)
    dump("data/gates/tokens.json", metric(result))
    sys.exit(0 if bad == 0 else 1)

def train():
    from draftgate.gates.result import require_passed
    require_passed("data/gates/tokens.json", "gate_tokens", "fix the tokens")
    seed = P["train"]["seed"]
    tokens = Path("data/tokens/tokens.jsonl").read_text()
    weights = sha("%s:%s" % (seed, tokens))
    Path("data/drafter").mkdir(parents=True, exist_ok=True)
    Path("data/drafter/model.txt").write_text(weights + "\n")
    dump("data/drafter/manifest.json", {"format": "tiny/1", "weights_fingerprint": weights})
    dump("data/drafter/sglang/config.json", {"architectures": ["LlamaForCausalLMEagle3"], "seed": seed})
    Path("data/drafter/sglang/model.txt").write_text(weights + "\n")     # an export: a folder inside the out
    mismatch = sum(json.loads(l)["match"] != "exact" for l in tokens.splitlines()) / len(tokens.splitlines())
    dump("metrics/eval.json", {"acceptance_length": round(2.5 + seed / 100 - mismatch, 6)})
    Path("plots/loss.csv").write_text("step,loss\n" + "".join("%d,%s\n" % (s, round(3.0 / (s + 1) + seed / 100, 4)) for s in range(5)))

globals()[sys.argv[1]]()
'''


def env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t"}


class Repo:
    def __init__(self, root: Path):
        self.root = root

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(list(cmd), cwd=self.root, env=env(), capture_output=True, text=True)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out

    def params(self) -> dict:
        return yaml.safe_load((self.root / "params.yaml").read_text())

    def set(self, **dotted: Any) -> None:
        """set(reconstruct__method="text") sets reconstruct.method in params.yaml."""
        params = self.params()
        for key, value in dotted.items():
            *parents, leaf = key.split("__")
            node = params
            for p in parents:
                node = node[p]
            node[leaf] = value
        (self.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    def commit(self, message: str) -> str:
        """Commit everything `dvc repro` left: dvc.lock, metrics, plots, DVC's .gitignore files."""
        self.run("git", "add", "-A")
        self.run("git", "commit", "-qm", message)
        return self.run("git", "rev-parse", "HEAD").stdout.strip()

    def json(self, path: str) -> Any:
        return json.loads((self.root / path).read_text())


def new_repo(root: Path) -> Repo:
    root.mkdir(parents=True, exist_ok=True)
    repo = Repo(root)
    repo.run("git", "init", "-q", "-b", "main")
    repo.run("dvc", "init", "-q")
    repo.run("dvc", "config", "core.analytics", "false")
    (root / "tiny.py").write_text(TINY)
    (root / "dvc.yaml").write_text(DVC_YAML.lstrip())
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    (root / "expectations").mkdir()
    (root / "expectations" / "tokens.json").write_text(json.dumps(SUITE, indent=1) + "\n")
    repo.commit("pipeline")
    return repo


def with_history(root: Path) -> Repo:
    """Two commits and one experiment, the workspace back at HEAD:

    run 1   reconstruct.method=auto: no mismatches, acceptance 2.5
    run 2   reconstruct.method=text: 2 of 8 rows differ (0.25); new tokens, new drafter
    seed3   an experiment on run 2 with train.seed=3: a new drafter from the same tokens
    """
    repo = new_repo(root)
    repo.run("dvc", "repro", "-q")
    repo.commit("run 1: auto")
    repo.set(reconstruct__method="text")
    repo.run("dvc", "repro", "-q")
    repo.commit("run 2: text")
    repo.run("dvc", "exp", "run", "-q", "-S", "train.seed=3", "-n", "seed3")
    restore(repo)
    return repo


def restore(repo: Repo) -> None:
    """The workspace back at HEAD: git's files, then DVC's cached outs to match HEAD's dvc.lock."""
    repo.run("git", "checkout", "-q", "--", ".")
    repo.run("git", "clean", "-qfd", "--", "metrics", "plots", "data/gates")
    repo.run("dvc", "checkout", "-q", "--force")


def history_copy(tmp_path_factory: Any, name: str) -> Repo:
    """A private copy of `with_history`'s repository: built once per test process (~20 s on 2 busy
    cores), copied per test module (git, DVC cache, experiments and all) so modules can change theirs."""
    import shutil

    template = tmp_path_factory.getbasetemp() / "dvc-history"
    if not (template / ".git").is_dir():
        shutil.rmtree(template, ignore_errors=True)
        with_history(template)
    dest = tmp_path_factory.mktemp(name)
    shutil.copytree(template, dest, symlinks=True, dirs_exist_ok=True)
    return Repo(dest)
