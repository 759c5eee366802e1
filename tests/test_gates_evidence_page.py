"""A failed check shows the evidence its suite computed, in the details JSON and on the page, seen in Chromium.

The artifacts are corrupted, never the flags: a tokens table with one completion id changed and
one prompt id swapped, a response billed one more token than its ids count, a template probe whose
code render is one byte off. The stages' own columns about those rows (match, first_diff,
diff_context, billing_residual) stay as they were written; the evidence comes from the suites'
views (expectations/tokens.json, template.json).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re

import pyarrow as pa
import pytest
import yaml

from browser import dump_dom
from draftgate.contract import check_template
from draftgate.gates import validate as gates
from draftgate.lineage import datadocs
from draftgate.official import official_template
from draftgate.reconstruct.core import Setup
from draftgate.templates import get_template
from draftgate.templates.probes import PROBES
from draftgate.templates.shapes import covering_corpus
from reconstruct_fixtures import reconstruct_tables
from stages import gate_template
from test_official import SUITE as TEMPLATE_SUITE
from test_reconstruct_gate import gate, greetings, names, tables

WHEN = dt.datetime(2026, 12, 2, 1, 0, tzinfo=dt.timezone.utc)


def swap_id(table, pid, where, old, new):
    """Row `pid` with the id `old` replaced by `new` in its completion or prompt (same length: every
    count, the loss mask and the row's own flags stay)."""
    rows = table.to_pylist()
    for r in rows:
        if r["prompt_id"] == pid:
            n = r["prompt_len"]
            part = r["completion_ids"] if where == "completion" else r["input_ids"][:n]
            assert old in part
            part = [new if i == old else i for i in part]
            if where == "completion":
                r["completion_ids"], r["input_ids"] = part, r["input_ids"][:n] + part
            else:
                r["input_ids"] = part + r["input_ids"][n:]
    return pa.Table.from_pylist(rows, schema=table.schema)


@pytest.fixture(scope="module")
def tokens_gate(tmp_path_factory, qwen3_tok):
    """One tokens gate over three corrupted rows: p1's " there" is " here" in its completion, p2's
    prompt says "system" where the backend served "user", and p0 was billed one token more."""
    tmp = tmp_path_factory.mktemp("tokens")
    tok, ids = qwen3_tok, names(qwen3_tok, "qwen3")
    responses, prompts = tables(*greetings(tok))
    table, _, _ = reconstruct_tables(responses, prompts, Setup(tok, get_template("qwen3"), ids, False))
    [there], [here] = tok.encode_ordinary(" there"), tok.encode_ordinary(" here")
    [user], [system] = tok.encode_ordinary("user"), tok.encode_ordinary("system")
    table = swap_id(swap_id(table, "p1", "completion", there, here), "p2", "prompt", user, system)
    bills = responses.column("billed_completion_tokens").to_pylist()
    bills[0] += 1
    responses = responses.set_column(responses.schema.get_field_index("billed_completion_tokens"),
                                     "billed_completion_tokens", pa.array(bills, pa.int64()))
    code, failed = gate(tmp, tok, table, responses, "qwen3", ids, prompts)
    result = json.loads((tmp / "r.json").read_text())
    return {"code": code, "failed": failed, "result": result, "table": table, "tok": tok, "tmp": tmp,
            "ids": {"there": there, "here": here, "user": user, "system": system}}


def check(result, column):
    [e] = [e for e in result["expectations"] if e["kwargs"].get("column") == column]
    return e


def test_one_completion_id_changed_shows_the_first_differing_token_with_its_context_ours_vs_the_truth(tokens_gate):
    g = tokens_gate
    assert g["code"] == 1 and "n_semantic" in g["failed"]
    # The row itself still says it is exact: only its ids changed.
    assert g["table"].to_pylist()[1]["match"] == "exact"
    [row] = check(g["result"], "n_semantic")["offending_rows"]
    assert (row["prompt_id"], row["dataset"], row["text_first_diff"]) == ("p1", "chat", 1)
    tok, ids = g["tok"], g["ids"]
    [hi], [dot], end = tok.encode_ordinary("Hi"), tok.encode_ordinary("."), tok.token_id("<|im_end|>")
    # The tokens before it (the same on both sides), then ours and the truth from the first difference on.
    assert row["text_before"] == f'{hi} "Hi"'
    assert row["text_ours"] == f'{ids["here"]} " here" · {dot} "." · {end} "<|im_end|>"'
    assert row["text_truth"] == f'{ids["there"]} " there" · {dot} "." · {end} "<|im_end|>"'


def test_a_prompt_id_swapped_shows_where_it_first_differs_from_the_ids_the_backend_served(tokens_gate):
    g = tokens_gate
    [row] = check(g["result"], "kept_prompt_differs_from_served")["offending_rows"]
    assert row["prompt_id"] == "p2" and row["kept_prompt_differs_from_served"] == "p2"
    # <|im_start|> then the role: the second prompt id.
    assert row["prompt_first_diff"] == 1
    assert row["prompt_before"] == f'{g["tok"].token_id("<|im_start|>")} "<|im_start|>"'
    assert row["prompt_ours"].startswith(f'{g["ids"]["system"]} "system" · ')
    assert row["prompt_served"].startswith(f'{g["ids"]["user"]} "user" · ')


def test_a_response_billed_one_more_token_shows_billed_vs_counted_and_the_convention(tokens_gate):
    g = tokens_gate
    assert {"billing_row_agreement", "kept_billing_residual"} <= g["failed"]
    counted = len(g["tok"].encode("Hello!<|im_end|>"))
    for column in ("billing_row_agreement", "kept_billing_residual"):
        assert check(g["result"], column)["offending_rows"] == [
            {"prompt_id": "p0", "dataset": "chat", "billed_completion": counted + 1, "counted_completion": counted,
             "ends_with_end_token": True, "completion_convention": "counts_end", "completion_residual": -1}]
    # Passing checks carry no rows: the second pass reads the table for the failed ones only.
    assert all("offending_rows" not in e for e in g["result"]["expectations"] if e["success"])


@pytest.fixture(scope="module")
def template_gate(tmp_path_factory, smollm2_tok):
    """The template gate on SmolLM2's real probes, one code render one byte off ("user" -> "usEr")."""
    tmp = tmp_path_factory.mktemp("template")
    contract = check_template(get_template("chatml"), official_template(smollm2_tok, "smollm2"),
                              PROBES + covering_corpus())
    probes = [p.to_dict() for p in contract.probes]
    [first] = [p for p in probes if p["status"] == "compared"][:1]
    at = first["code_text"].index("user")
    first["code_text"] = first["code_text"][:at] + "usEr" + first["code_text"][at + 4:]
    (tmp / "contract.json").write_text(json.dumps({**contract.document(), "template_probes": probes}))
    (tmp / "params.yaml").write_text(yaml.safe_dump({"gates": {"template": {"min_compared": 1}}}))
    code = gate_template.main([str(TEMPLATE_SUITE), str(tmp / "contract.json"), "--result", str(tmp / "r.json"),
                               "--params", str(tmp / "params.yaml"), "--no-docs"])
    return {"code": code, "probe": first, "at": at, "result": json.loads((tmp / "r.json").read_text()), "tmp": tmp}


def test_a_template_probe_one_byte_off_shows_the_probe_and_the_first_differing_bytes(template_gate):
    g = template_gate
    assert g["code"] == 1
    # The contract stage's own account of the probe says nothing differs.
    assert (g["probe"]["first_diff"], g["probe"]["diff_context"]) == (None, None)
    e = check(g["result"], "differs")
    assert e["unexpected_count"] == 1
    [row] = e["offending_rows"]
    at = g["at"] + 2          # "us" agree, then "e" (65) against "E" (45)
    assert row["probe"] == g["probe"]["probe"] and row["first_diff_char"] == at
    assert row["differs"].endswith(f"differ from char {at}")
    assert row["official_bytes"].startswith("65 72") and row["ours_bytes"].startswith("45 72")
    assert "us⟦e⟧r" in row["official_around"] and "us⟦E⟧r" in row["ours_around"]


def text_of(dom: str) -> str:
    """What a reader sees: the DOM's text, entities decoded."""
    return html.unescape(" ".join(re.sub(r"<[^>]+>", " ", dom).split()))


def test_headless_chromium_shows_each_checks_note_and_a_failed_checks_evidence_on_the_validation_pages(
        tokens_gate, template_gate, tmp_path):
    records = []
    for gate_name, g in (("gate_tokens", tokens_gate), ("gate_template", template_gate)):
        path = g["tmp"] / f"{g['result']['suite']}.details.json"
        path.write_text(json.dumps(g["result"]), encoding="utf-8")
        records.append(datadocs.Record(gate_name, path, g["result"], "workspace", WHEN))
    pages = datadocs.rebuild(tmp_path / "site", records)

    tokens = text_of(dump_dom(tmp_path / "site" / pages["gate_tokens"], tmp_path / "profile"))
    # Every check's note, passing or not, under its row on the validation page itself.
    for e in tokens_gate["result"]["expectations"]:
        assert "What it checks: " + " ".join(e["meta"]["notes"].replace("`", "").split())[:60] in tokens
    # The failed checks' rows with the suite's evidence, escaped (ids decode to text like <|im_end|>).
    ids = tokens_gate["ids"]
    assert "Offending rows (the first 1, with the evidence the suite computed)" in tokens
    assert (f'prompt_id dataset text_first_diff text_before text_ours text_truth p1 chat 1 '
            f'{tokens_gate["tok"].encode_ordinary("Hi")[0]} "Hi" {ids["here"]} " here" · ') in tokens
    counted = len(tokens_gate["tok"].encode("Hello!<|im_end|>"))
    assert (f"prompt_id dataset billed_completion counted_completion ends_with_end_token completion_convention "
            f"completion_residual p0 chat {counted + 1} {counted} true counts_end -1") in tokens
    # Escaped once: the reader sees the end token's own text, not markup and not &lt;.
    assert f'{tokens_gate["tok"].token_id("<|im_end|>")} "<|im_end|>"' in tokens and "&lt;" not in tokens

    template = text_of(dump_dom(tmp_path / "site" / pages["gate_template"], tmp_path / "profile"))
    at = template_gate["at"] + 2
    assert (f'probe differs first_diff_char official_around ours_around official_bytes ours_bytes '
            f'{template_gate["probe"]["probe"]}') in template
    assert "65 72" in template and "45 72" in template and "us⟦E⟧r" in template


def test_a_suite_whose_evidence_names_no_column_of_its_view_has_no_verdict_and_says_which(tmp_path, capsys):
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt_id": ["a", "b"], "n": [1, 9]}), tmp_path / "t.parquet")
    suite = {"name": "t", "view": "SELECT prompt_id, n, n * 2 AS twice FROM t", "expectations": [
        {"type": "expect_column_max_to_be_between", "kwargs": {"column": "n", "max_value": 4},
         "meta": {"notes": "n stays small.", "evidence": {"rows": "big", "columns": ["twice", "thrice"]}}}]}
    (tmp_path / "t.json").write_text(json.dumps(suite))

    code = gates.main([str(tmp_path / "t.json"), str(tmp_path / "t.parquet"), "--no-docs"])

    assert code == 2
    err = capsys.readouterr().err
    assert "t.json: expectations[0] expect_column_max_to_be_between(n) meta.evidence names 'big', 'thrice'" in err
    assert "add it to the suite's view or drop it (columns: prompt_id, n, twice)" in err
