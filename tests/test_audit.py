"""`draftgate audit`: one row per commit and experiment in DuckDB, and `--diff A B`, on a real git + DVC
repository (tests/dvc_repo.py). The last two tests change the repository: a failed gate, then a
changed suite; they run in file order."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import duckdb
import pytest

from dvc_repo import Repo, history_copy, restore
from draftgate.lineage import audit
from draftgate.lineage.collect import collect_all
from draftgate.lineage.db import TABLES

DOCS = Path(__file__).resolve().parents[1] / "docs" / "lineage.md"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Repo:
    return history_copy(tmp_path_factory, "audit")


def diff_rows(repo: Repo, a: str, b: str, capsys) -> list[dict]:
    assert audit.main(["--repo", str(repo.root), "--diff", a, b, "--format", "csv"]) == 0
    return list(csv.DictReader(io.StringIO(capsys.readouterr().out)))


def changed(rows: list[dict], section: str) -> dict[str, tuple[str, str]]:
    return {r["key"]: (r["a"], r["b"]) for r in rows if r["section"] == section}


def build_db(repo: Repo, with_failed: bool = False) -> duckdb.DuckDBPyConnection:
    db = repo.root.parent / f"{repo.root.name}.duckdb"     # outside the repository: commits stay clean
    audit.build(repo.root, db, with_failed=with_failed)
    return duckdb.connect(str(db), read_only=True)


def test_diff_of_two_commits_names_the_param_the_artifacts_and_the_figures_that_changed(repo, capsys):
    rows = diff_rows(repo, "HEAD~1", "HEAD", capsys)
    assert changed(rows, "params") == {"reconstruct.method": ("auto", "text")}
    artifacts = changed(rows, "artifact")
    assert {"data/tokens", "data/drafter", "plots/mismatch.csv"} <= set(artifacts)
    assert "data/responses" not in artifacts and "data/contract/contract.json" not in artifacts   # upstream: same
    old, new = artifacts["data/tokens"]
    assert old.endswith(".dir") and new.endswith(".dir") and old != new      # full hashes in CSV
    figures = changed(rows, "figure")
    assert figures["metrics/mismatch.json:datasets.all.mismatch_rate"] == ("0", "0.25")
    assert figures["metrics/eval.json:acceptance_length"] == ("2.5", "2.25")
    assert changed(rows, "gate")["gate_tokens.observed.dataset_mismatch_rate.max"] == ("0", "0.25")
    assert "data/drafter/manifest.json#weights_fingerprint" in changed(rows, "fingerprint")
    assert not changed(rows, "suite") and not changed(rows, "code")


def test_diff_of_an_experiment_and_its_baseline_is_the_seed_and_the_drafter_only(repo, capsys):
    rows = diff_rows(repo, "HEAD", "seed3", capsys)
    assert changed(rows, "params") == {"train.seed": ("0", "3")}
    assert set(changed(rows, "artifact")) == {"data/drafter", "plots/loss.csv"}
    assert set(changed(rows, "figure")) == {"metrics/eval.json:acceptance_length"}
    assert not changed(rows, "gate")


def test_the_experiments_are_the_ones_dvc_exp_show_lists(repo):
    shown = json.loads(repo.run("dvc", "exp", "show", "--json").stdout)
    dvc_exps = {r["name"]: r["rev"] for base in shown for e in base.get("experiments") or [] for r in e["revs"]}
    revs = collect_all(repo.root)
    assert {r.run: r.snap.rev for r in revs if r.snap.kind == "experiment"} == dvc_exps == {"seed3": dvc_exps["seed3"]}


def test_every_revision_is_a_row_and_the_duckdb_file_opens_directly(repo):
    con = build_db(repo)
    runs = con.sql("SELECT run, kind, head FROM runs ORDER BY seq").fetchall()
    head = repo.run("git", "rev-parse", "HEAD").stdout.strip()[:8]
    assert [(k, h) for _, k, h in runs] == [("commit", False), ("commit", True), ("experiment", False),
                                            ("workspace", False)]
    assert runs[1][0] == head and runs[2][0] == "seed3"
    summary = con.sql("SELECT run, mismatch_rate, billing_agreement, acceptance_length, gate_tokens, gates_failed, "
                      "spent_usd FROM summary ORDER BY seq").fetchall()
    assert summary[0][1:] == (0.0, 1.0, 2.5, True, 0, 0.008)
    assert summary[1][1:] == (0.25, 1.0, 2.25, True, 0, 0.008)
    assert summary[2][3] == 2.28      # seed3: 2.5 + 3/100 - 0.25
    tables = {t for (t,) in con.sql("SHOW TABLES").fetchall()}
    assert tables == {"summary", *TABLES}


def test_the_table_and_markdown_outputs_shorten_hashes_and_show_verdicts(repo, capsys):
    assert audit.main(["--repo", str(repo.root), "--db", "", "--format", "md", "--wide"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("| run | seq | kind |") and "| seed3 |" in md and "| pass |" in md
    assert not re.search(r"\b[0-9a-f]{32}\b", md)           # 8-hex prefixes, not full md5s
    assert audit.main(["--repo", str(repo.root), "--db", "", "--diff", "HEAD", "HEAD"]) == 0
    assert "no difference between HEAD and HEAD" in capsys.readouterr().out


def sql_blocks() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOCS.read_text(encoding="utf-8"), flags=re.S)


def test_every_query_docs_lineage_md_documents_runs_on_the_audit_database(repo):
    con = build_db(repo)
    blocks = sql_blocks()
    assert len(blocks) >= 6
    for sql in blocks:
        con.sql(sql).fetchall()        # raises on a typo, an unknown column or table
    older = con.sql(blocks[0]).fetchall()
    assert older == []                 # every drafter so far passed today's suite


def test_a_failed_gate_shows_failed_with_its_figure(repo, capsys):
    repo.set(gates__tokens__max_mismatch_rate=0.1)        # text reconstruction differs on 0.25 of rows
    out = repo.run("dvc", "repro", check=False)
    assert out.returncode != 0 and "gate_tokens" in out.stderr
    con = build_db(repo)
    assert con.sql("SELECT gate_tokens, gates_failed FROM summary WHERE run = 'workspace'").fetchall() == [(False, 1)]
    failed = con.sql("SELECT g.gate, g.failed, f.key, f.value FROM gates g JOIN gate_figures f USING (run, gate) "
                     "WHERE g.run = 'workspace' AND NOT g.success AND f.key = 'dataset_mismatch_rate.max'").fetchall()
    assert failed == [("gate_tokens", 1, "dataset_mismatch_rate.max", 0.25)]
    assert con.sql(sql_blocks()[1]).fetchall()               # the documented "failed gates" query finds it
    gate = changed(diff_rows(repo, "HEAD", "workspace", capsys), "gate")
    assert gate["gate_tokens.verdict"] == ("pass", "FAIL") and gate["gate_tokens.failed"] == ("0", "1")
    restore(repo)


def test_a_changed_suite_shows_a_new_hash_and_the_older_suite_query_finds_the_drafters_it_passed(repo, capsys):
    suite = repo.root / "expectations" / "tokens.json"
    suite.write_text(json.dumps({"name": "tokens", "checks": ["row_count", "mismatch_rate", "ids"]}) + "\n")
    repo.run("dvc", "repro", "-q")
    repo.commit("tokens suite: one more check")
    rows = diff_rows(repo, "HEAD~1", "HEAD", capsys)
    [(old_md5, new_md5)] = changed(rows, "suite").values()
    assert old_md5 != new_md5
    gate = changed(rows, "gate")
    assert gate["gate_tokens.suite_md5"] == (old_md5, new_md5)
    assert "gate_tokens.suite_sha256" in gate
    assert not changed(rows, "params") and "data/tokens" not in changed(rows, "artifact")
    con = build_db(repo)
    older = con.sql(sql_blocks()[0]).fetchall()
    assert sorted(r[0] for r in older) == sorted(
        r for (r,) in con.sql("SELECT run FROM runs WHERE kind IN ('commit', 'experiment') AND NOT head").fetchall())
    assert {r[5] for r in older} == {old_md5}


def test_the_audit_never_writes_a_dvc_output_so_dvc_status_stays_clean(repo, capsys):
    # reports/audit.duckdb is the report stage's output in the real pipeline: the default is not.
    import yaml as _yaml

    from draftgate.lineage.pipeline import Pipeline

    real = Pipeline(_yaml.safe_load((Path(__file__).resolve().parents[1] / "dvc.yaml").read_text()), None)
    assert real.producer(audit.DEFAULT_DB) is None and real.producer("reports/audit.duckdb") is not None
    assert audit.main(["--repo", str(repo.root), "--db", "data/tokens/audit.duckdb", "--no-dvc"]) == 2
    err = capsys.readouterr().err
    assert "stage 'reconstruct' writes data/tokens (a DVC output)" in err and "write elsewhere" in err
    assert not (repo.root / "data" / "tokens" / "audit.duckdb").exists()
