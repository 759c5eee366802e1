"""End to end: `dvc repro` on a throwaway copy of this repository, with the real stack.

Small generation settings keep the repro to about three minutes on 2 cores; everything else is the default.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


# Untracked files are copied only from the source folders: a checkout that has run `make repro`
# also holds DVC's untracked outputs (dvc.lock, metrics/, data/*/.gitignore), which a fresh clone
# does not, and the tests must not depend on what the checkout ran before.
SOURCE_DIRS = ("draftgate", "stages", "tests", "expectations", "bench", "docs")


def copy_repo(dest: Path) -> Path:
    """Copy what a fresh clone would hold (tracked files, plus new source files not yet committed)
    into a new git repo."""
    def listed(*args: str) -> list[str]:
        out = subprocess.run(["git", "ls-files", "-z", *args], cwd=REPO, capture_output=True, check=True)
        return out.stdout.decode().split("\0")
    files = listed("--cached") + listed("--others", "--exclude-standard", "--", *SOURCE_DIRS)
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    run(["git", "init", "-q"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"], dest)
    return dest


def run(cmd: list[str], cwd: Path, check: bool = True, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env_vars}
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out


def set_params(repo: Path, **sections: dict) -> None:
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for section, values in sections.items():
        params[section].update(values)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def gate(repo: Path, name: str) -> dict:
    return json.loads((repo / "data" / "gates" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory) -> Path:
    repo = copy_repo(tmp_path_factory.mktemp("repo"))
    set_params(repo, generate={"limit": 12, "max_tokens": 24})
    # The same for speculative decoding: 8 new tokens per held-out prompt (eval and gate_eval
    # decode them at about a second per verify step on 2 cores; 64 made them 110 s of the run).
    set_params(repo, eval={"max_new_tokens": 8, "bootstrap_samples": 200})
    # The seeded corpus's breadth is tests/test_contract_corpus.py's; here the contract only has to run.
    set_params(repo, contract={"corpus_size": 60})
    # One torch thread per stage, as in every other test (conftest.py): make test runs two xdist
    # workers on two cores, and a stage of two threads beside the other worker's forwards waits on
    # its threads' spin (two such processes ran a forward loop 3x slower than two of one thread).
    for section in ("repair", "hidden", "drafter", "eval"):
        set_params(repo, **{section: {"threads": 1}})
    # 24 new tokens truncate nearly every answer: fine for plumbing, not what the gate defaults expect.
    gates = yaml.safe_load((repo / "params.yaml").read_text())["gates"]
    gates["responses"]["max_length_rate"] = 1.0
    gates["tokens"]["max_dataset_length_rate"] = 1.0
    # A drafter trained on 11 answers of 24 tokens learns next to nothing: the plumbing must run end
    # to end, but the acceptance floor is for real training data (tests/test_eval_gate.py checks it).
    gates["eval"]["min_acceptance_length"] = 1.0
    set_params(repo, gates=gates)
    return repo


def test_repro_runs_every_stage_and_every_gate_passes(small_repo):
    run(["dvc", "repro"], small_repo)
    stages = yaml.safe_load((small_repo / "dvc.yaml").read_text())["stages"]
    for name in (s.removeprefix("gate_") for s in stages if s.startswith("gate_")):
        assert gate(small_repo, name)["success"] is True, name
    assert (small_repo / "reports" / "data_docs" / "index.html").is_file()


def test_repro_reconstructs_every_response_and_reports_the_text_methods_mismatch_rate(small_repo):
    import pyarrow.parquet as pq

    tokens = pq.read_table(small_repo / "data" / "tokens" / "tokens.parquet").to_pylist()
    assert len(tokens) == 12
    assert {t["method"] for t in tokens} == {"text"}          # the default rebuilds ids from text
    assert all(t["quarantine_reason"] is None for t in tokens)
    report = json.loads((small_repo / "metrics" / "mismatch.json").read_text())["datasets"]["all"]
    assert report["rows"] == 12 and report["exact"] + report["bpe_only"] + report["semantic"] == 12


def test_repro_repairs_the_text_rows_and_breaks_none_the_server_made_exact(small_repo):
    import pyarrow.parquet as pq

    repaired = pq.read_table(small_repo / "data" / "repair" / "tokens.parquet").to_pylist()
    assert len(repaired) == 12 and {t["repair_status"] for t in repaired} <= {"repaired", "kept"}
    assert all(t["text_ids"] is not None for t in repaired if t["method"] == "repaired")
    truth = json.loads((small_repo / "metrics" / "repair.json").read_text())["truth"]
    assert truth["exact_broken"] == 0 and truth["differing_after"] <= truth["differing_before"]


def test_a_second_repro_is_a_no_op(small_repo):
    out = run(["dvc", "repro"], small_repo)
    assert "up to date" in out.stdout


def test_repair_rerun_on_another_thread_count_writes_the_same_bytes_so_nothing_downstream_reruns(small_repo):
    # What another CPU does to the scores, done here by the thread count: the margins move in their
    # last bits, and the table stores them at a precision that noise cannot move (repair/run.py), so
    # its bytes, and with them everything after it, stay as they were. (The hidden shards' bytes
    # follow hidden.threads, not the machine: tests/test_hidden_shards.py.)
    table = small_repo / "data" / "repair" / "tokens.parquet"
    before = table.read_bytes()
    committed = yaml.safe_load((small_repo / "params.yaml").read_text())["repair"]["threads"]
    set_params(small_repo, repair={"threads": 2 if committed == 1 else 1})
    run(["dvc", "repro", "--single-item", "repair"], small_repo)
    assert table.read_bytes() == before
    out = run(["dvc", "status"], small_repo)
    assert "up to date" in out.stdout, out.stdout


def test_the_journal_stays_out_of_dvcs_cache_and_git_and_the_metrics_name_it(small_repo):
    import hashlib

    journal = small_repo / "data" / "responses" / "journal.jsonl"
    data = journal.read_bytes()
    assert json.loads((small_repo / "metrics" / "generate.json").read_text())["journal_lines"] == 12
    details = json.loads((small_repo / "metrics" / "generate.details.json").read_text())
    assert details["journal_sha256"] == hashlib.sha256(data).hexdigest()
    md5 = hashlib.md5(data).hexdigest()
    assert not [p for p in (small_repo / ".dvc" / "cache").rglob("*") if p.name == md5[2:]]
    assert run(["git", "check-ignore", "-q", str(journal)], small_repo, check=False).returncode == 0


def test_a_checkout_without_the_journal_finds_generate_up_to_date_so_a_queued_experiment_pays_nothing(small_repo):
    # A `dvc exp run --queue` temp directory holds what git and the DVC cache hold: no journal.
    journal = small_repo / "data" / "responses" / "journal.jsonl"
    aside = journal.with_name("journal.aside")
    journal.rename(aside)
    try:
        out = run(["dvc", "status", "generate"], small_repo).stdout
    finally:
        aside.rename(journal)
    assert "up to date" in out, out


def test_a_change_to_the_tokenizer_code_makes_generate_and_reconstruct_stale(small_repo):
    code = small_repo / "draftgate" / "tokenizers" / "smollm2.py"
    original = code.read_text()
    code.write_text(original + "\n# a fix to the SmolLM2 conversion\n")
    try:
        out = run(["dvc", "status"], small_repo).stdout
    finally:
        code.write_text(original)
    for stage in ("contract", "prompts", "generate", "reconstruct"):
        assert f"{stage}:" in out, out


def ran(out: subprocess.CompletedProcess) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", out.stdout)


# The last three tests break the small repo on purpose, each after the one before it: a gate that
# fails, then a contract that fails upstream of it (contract runs before prompts: prompts depends
# on its gate), then one table (--single-item). Each puts its params and raw data back.

def test_a_failed_gate_stops_repro_before_the_next_stage(small_repo):
    raw, params = small_repo / "data" / "raw" / "chat.jsonl", small_repo / "params.yaml"
    saved = raw.read_bytes(), params.read_text()
    responses = (small_repo / "data" / "responses" / "responses.parquet").read_bytes()
    try:
        # One unusable record, and a gate that tolerates no rejects.
        with open(raw, "a") as f:
            f.write('{"messages": [{"role": "narrator", "content": "hi"}]}\n')
        set_params(small_repo, gates={**yaml.safe_load(params.read_text())["gates"],
                                      "prompts": {"max_rejects_rate": 0.0, "min_heldout_fraction": 0.03,
                                                  "max_heldout_fraction": 0.25}})
        out = run(["dvc", "repro"], small_repo, check=False)
    finally:
        raw.write_bytes(saved[0])
        params.write_text(saved[1])
    assert out.returncode != 0
    assert ran(out) == ["prompts", "gate_prompts"], out.stdout
    assert gate(small_repo, "prompts")["success"] is False
    assert (small_repo / "data" / "responses" / "responses.parquet").read_bytes() == responses


def test_a_wrong_configured_special_id_stops_the_pipeline_at_the_contract_gate(small_repo):
    params = small_repo / "params.yaml"
    saved = params.read_text()
    try:
        # The seed run's bug in miniature: an id that is an ordinary token, configured for <|im_end|>.
        tok = yaml.safe_load(saved)["tokenizer"]
        set_params(small_repo, tokenizer={**tok, "expected_ids": {"<|im_end|>": 1000}})
        out = run(["dvc", "repro"], small_repo, check=False)
    finally:
        params.write_text(saved)
    assert out.returncode != 0
    assert ran(out) == ["contract", "gate_contract"], out.stdout     # prompts, stale since the last test, waits
    assert gate(small_repo, "contract")["success"] is False
    assert "expected" in json.dumps(json.loads((small_repo / "data" / "contract" / "contract.json").read_text()))


def test_a_corrupted_tokens_table_fails_its_gate(small_repo):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = small_repo / "data" / "tokens" / "tokens.parquet"
    table = pq.read_table(path)
    # Drop the end token from every completion (input ids and mask kept consistent), and leave
    # every column the reconstruct stage wrote about the rows as it was: the gate reads the ids.
    rows = table.to_pylist()
    for r in rows:
        r["completion_ids"] = r["completion_ids"][:-1]
        r["input_ids"] = r["input_ids"][:-1]
        r["loss_mask"] = r["loss_mask"][:-1]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    out = run(["dvc", "repro", "--single-item", "gate_tokens"], small_repo, check=False)
    assert out.returncode != 0
    details = json.loads((small_repo / "data" / "gates" / "tokens.details.json").read_text())
    failed = {e["kwargs"].get("column") for e in details["expectations"] if not e["success"]}
    # Rows the model stopped on lack their end token; every row's length no longer matches its bill.
    assert gate(small_repo, "tokens")["success"] is False
    assert {"kept_without_end_token", "billing_row_agreement"} <= failed
