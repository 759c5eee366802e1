"""A failed gate explains itself where the user stands: its own page, written by the gate, at the link it prints.

The drill of issue 29: one kept row of a real tokens table loses its last completion id and its
last loss-mask entry (the artifact corrupted, never a flag), and the tokens gate runs as dvc.yaml
runs it, from the project's root, with a dvc.yaml naming the stage that wrote the table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from browser import dump_dom
from draftgate.gates import page
from draftgate.gates import validate as gates
from draftgate.reconstruct.core import Setup
from draftgate.templates import get_template
from reconstruct_fixtures import reconstruct_tables
from draftgate.contract import vocab_table
from draftgate.templates.roles import template_roles
from test_reconstruct_gate import THRESHOLDS, greetings, names, tables

SUITE = Path(__file__).resolve().parents[1] / "expectations" / "tokens.json"
DVC_YAML = {"stages": {
    "reconstruct": {"cmd": "python -m stages.reconstruct --out data/tokens", "outs": ["data/tokens"]},
    "gate_tokens": {"cmd": "python -m stages.gate expectations/tokens.json data/tokens/tokens.parquet",
                    "outs": [{"data/gates/tokens.details.json": {"cache": False}}],
                    "metrics": [{"data/gates/tokens.json": {"cache": False}}]}}}


def drop_last_completion_id(table: pa.Table, pid: str) -> pa.Table:
    rows = table.to_pylist()
    for r in rows:
        if r["prompt_id"] == pid:
            r["completion_ids"], r["loss_mask"] = r["completion_ids"][:-1], r["loss_mask"][:-1]
    return pa.Table.from_pylist(rows, schema=table.schema)


@pytest.fixture(scope="module")
def drill(tmp_path_factory, qwen3_tok):
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("drill")
    tok, ids = qwen3_tok, names(qwen3_tok, "qwen3")
    responses, prompts = tables(*greetings(tok))
    table, _, _ = reconstruct_tables(responses, prompts, Setup(tok, get_template("qwen3"), ids, False))
    for d in ("data/tokens", "data/gates", "data/responses", "data/contract", "data/prompts"):
        (root / d).mkdir(parents=True)
    pq.write_table(drop_last_completion_id(table, "p1"), root / "data/tokens/tokens.parquet")
    pq.write_table(responses, root / "data/responses/responses.parquet")
    pq.write_table(prompts, root / "data/prompts/prompts.parquet")
    (root / "data/contract/contract.json").write_text(json.dumps(
        {"special_ids": ids, "roles": template_roles(get_template("qwen3"), ids)}))
    pq.write_table(vocab_table(tok), root / "data/contract/vocab.parquet")
    (root / "params.yaml").write_text(yaml.safe_dump({"gates": {"tokens": THRESHOLDS}}))
    (root / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML))
    return root


@pytest.fixture(scope="module")
def ran(drill):
    import contextlib
    import io
    import os

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(drill)       # dvc runs every stage from the project's root
    try:
        with contextlib.redirect_stdout(out):
            code = gates.main([str(SUITE), "data/tokens/tokens.parquet",
                               "--input", "responses=data/responses/responses.parquet",
                               "--input", "contract=data/contract/contract.json",
                               "--input", "vocab=data/contract/vocab.parquet",
                               "--input", "prompts=data/prompts/prompts.parquet",
                               "--metric", "data/gates/tokens.json", "--result", "data/gates/tokens.details.json",
                               "--params", "params.yaml", "--docs", "reports/data_docs"])
    finally:
        os.chdir(cwd)
    return code, out.getvalue(), json.loads((drill / "data/gates/tokens.details.json").read_text())


def failed_columns(result: dict) -> list[str]:
    return [e["kwargs"].get("column") for e in result["expectations"] if not e["success"]]


def test_the_gate_prints_the_link_of_its_own_page_last_and_the_page_is_there(ran, drill):
    code, printed, _ = ran
    assert code == 1
    last = printed.strip().splitlines()[-1]
    link = re.fullmatch(r"\s*why it failed: (file://\S+)", last)
    assert link, printed[-800:]
    assert link[1] == (drill / "reports" / "gates" / "tokens.html").resolve().as_uri()
    assert (drill / "reports" / "gates" / "tokens.html").is_file()


def test_the_root_failure_comes_first_and_the_ones_that_follow_from_it_after(ran):
    _, _, result = ran
    failed = failed_columns(result)
    assert failed[0] == "kept_bad_shape", failed
    assert "kept_without_end_token" in failed
    later = [c for c in failed if c in ("kept_prompt_differs_from_served", "n_semantic", "billing_row_agreement",
                                        "kept_billing_residual", "dataset_mismatch_rate")]
    assert all(failed.index(c) > failed.index("kept_without_end_token") for c in later)


def test_the_page_shows_the_offending_row_its_evidence_and_the_stage_to_rerun(ran, drill):
    _, _, result = ran
    text = (drill / "reports" / "gates" / "tokens.html").read_text()
    first = text.index("root failure: start here")
    assert text.index("kept_bad_shape") < first < text.index("kept_without_end_token")
    assert "stage <code>reconstruct</code>" in text and "<code>dvc repro gate_tokens</code>" in text
    assert 'href="../../stages/reconstruct.py"' in text
    # A failed null check says rows hold a value, never a share that is null.
    assert "1 of 3 rows have a value here; every row should be empty (null)" in text
    assert "% null" not in text
    # The offending row: its prompt id shown once per table, beside the evidence.
    table = text[first:text.index("</table>", first)]
    assert table.count(">p1<") == 1
    # Its evidence: 22 input ids, not 18 prompt + 3 completion; a loss mask one short.
    shape = dict(zip(re.findall(r"<th>(\w+)</th>", table), re.findall(r'<td class="mono">([^<]*)</td>', table)))
    assert (shape["input_len"], shape["prompt_len_recorded"], shape["counted_completion"], shape["loss_mask_len"],
            shape["loss_mask_ones"]) == ("22", "18", "3", "21", "3")


def test_the_failed_page_links_the_docs_page_that_explains_the_gate_beside_the_fix(ran, drill):
    text = (drill / "reports" / "gates" / "tokens.html").read_text()
    banner = text[text.index('<div class="banner fail">'):text.index("</div>", text.index('<div class="banner fail">'))]
    assert '<strong>Why, and the usual fixes:</strong> <a class=docs href="../../docs/pipeline.md">docs/pipeline.md</a>' \
        in banner


@pytest.mark.parametrize("suite", sorted(p.stem for p in SUITE.parent.glob("*.json")))
def test_every_suite_names_an_existing_docs_page_that_explains_that_gate(suite):
    from draftgate.gates.suite import load_suite

    docs = load_suite(str(SUITE.parent / f"{suite}.json")).meta.get("docs")
    assert docs, f"expectations/{suite}.json: add meta.docs, the docs page that explains gate_{suite}"
    page_text = (SUITE.parents[1] / docs).read_text()
    assert f"gate_{suite}" in page_text or f"expectations/{suite}.json" in page_text, \
        f"{docs} never names gate_{suite}: say there what the gate checks and how to fix a failure"


def test_the_page_is_what_the_report_rewrites_from_the_record(ran, drill):
    _, _, result = ran
    path = drill / "reports" / "gates" / "tokens.html"
    before = path.read_bytes()
    again = page.write(result, "reports/data_docs", root=drill, record="data/gates/tokens.details.json")
    assert again == path and path.read_bytes() == before


def test_a_failed_null_check_never_reads_like_a_pass():
    e = {"type": "expect_column_values_to_be_null", "kwargs": {"column": "kept_bad_shape"}, "success": False,
         "element_count": 118, "unexpected_count": 1, "unexpected_percent": 0.847}
    assert page.observed(e) == "1 of 118 rows have a value here; every row should be empty (null)"
    agg = {"type": "expect_column_max_to_be_between", "kwargs": {"column": "n_semantic", "max_value": 0},
           "success": False, "observed_value": 1}
    assert page.observed(agg) == "observed 1; allowed at most 0"


def test_headless_chromium_shows_the_root_failure_and_its_row(ran, drill, tmp_path):
    dom = dump_dom(drill / "reports" / "gates" / "tokens.html", tmp_path, budget_ms=1000)
    assert "FAILED:" in dom and "root failure: start here" in dom and ">p1<" in dom
    assert 'href="../../docs/pipeline.md"' in dom
