"""The repair gate (expectations/repair.json, stages/gate_repair.py) on small tables of real SmolLM2
ids: it passes a sound repair and fails, by name, a repaired row whose bytes differ by one token,
one whose length misses the bill, a changed exact row, and confidences that the rows made exact
contradict (draftgate/checks/repair.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "expectations" / "repair.json"
PARAMS = ROOT / "params.yaml"


@pytest.fixture(scope="module")
def ids(smollm2_tok):
    tok = smollm2_tok
    piece = lambda s: tok.token_id(s.replace(" ", "Ġ"))   # byte-level spelling of a piece
    end = tok.token_id("<|im_end|>")
    hello = tok.encode_ordinary("Hello there, friend.") + [end]
    canon = tok.encode_ordinary("def transpose") + [end]
    truth = tok.encode_ordinary("def") + [piece(" trans"), piece("pose"), end]
    other = tok.encode_ordinary("def") + [piece(" transp"), piece("ose"), end]   # the bill's length, not the truth
    assert tok.decode(truth) == tok.decode(canon) == tok.decode(other) and len(truth) == len(canon) + 1 == len(other)
    return {"end": end, "hello": hello, "canon": canon, "truth": truth, "other": other, "piece": piece}


def tables(ids, after_p1=None, after_p0=None, repaired=(), truth=True, capped=False):
    """p0 written canonically (exact), p1 re-split to the truth (or after_p1), and one more row per
    (ids after, confidence, high estimate) in `repaired`: canonical before, the truth returned."""
    import pyarrow as pa

    from draftgate import schema
    from draftgate.repair.run import schema as repaired_schema

    prompt = [1, 2, 3]

    def tok_row(pid, completion, method="text", text_ids=None, confidence=(0.9, 0.95), capped=False):
        return {"prompt_id": pid, "dataset": "code", "split": "train", "input_ids": prompt + completion,
                "prompt_len": len(prompt), "completion_ids": completion,
                "loss_mask": [0] * len(prompt) + [1] * len(completion), "method": method,
                "billing_convention": "counts_end", "provider": "local", "text_ids": text_ids,
                "repair_status": "repaired" if method == "repaired" else "kept",
                "repair_reason": None if method == "repaired" else "canonical", "repair_capped": capped,
                "repair_confidence": confidence[0], "repair_confidence_hi": confidence[1]}

    extra = [(f"q{k}", after_q, conf) for k, (after_q, *conf) in enumerate(repaired)]
    before = [tok_row("p0", ids["hello"]), tok_row("p1", ids["canon"])] + [tok_row(q, ids["canon"]) for q, _, _ in extra]
    p1 = after_p1 or ids["truth"]
    after = [tok_row("p0", after_p0 or ids["hello"], "repaired" if after_p0 else "text"),
             tok_row("p1", p1, "repaired", ids["canon"])]
    after += [tok_row(q, a, "repaired", ids["canon"], conf, capped) for q, a, conf in extra]
    responses = [{"prompt_id": pid, "status": "ok", "truth_ids": t if truth else None, "billed_completion_tokens": len(t)}
                 for pid, t in [("p0", ids["hello"]), ("p1", ids["truth"])] + [(q, ids["truth"]) for q, _, _ in extra]]
    return (pa.Table.from_pylist(after, schema=repaired_schema()),
            pa.Table.from_pylist([{k: v for k, v in r.items() if not k.startswith("repair_")} for r in before],
                                 schema=schema.tokens()),
            pa.Table.from_pylist(responses, schema=schema.responses()))


def run_gate(tmp_path, tok, after, before, responses, result=False):
    import pyarrow.parquet as pq

    from draftgate.contract import vocab_table
    from draftgate.templates.roles import template_roles
    from draftgate.templates import get_template
    from stages.gate_repair import main as gate

    for name, t in (("tokens", after), ("before", before), ("responses", responses)):
        pq.write_table(t, tmp_path / f"{name}.parquet")
    names = {n: tok.token_id(n) for n in get_template("chatml").special_names}
    (tmp_path / "contract.json").write_text(json.dumps(
        {"special_ids": names, "roles": template_roles(get_template("chatml"), names)}))
    pq.write_table(vocab_table(tok), tmp_path / "vocab.parquet")
    code = gate([str(SUITE), f"repair={tmp_path / 'tokens.parquet'}", "--result", str(tmp_path / "r.json"),
                       "--input", f"before={tmp_path / 'before.parquet'}",
                       "--input", f"responses={tmp_path / 'responses.parquet'}",
                       "--input", f"contract={tmp_path / 'contract.json'}",
                       "--input", f"vocab={tmp_path / 'vocab.parquet'}", "--params", str(PARAMS), "--no-docs"])
    record = json.loads((tmp_path / "r.json").read_text())
    failed = {e["kwargs"].get("column") for e in record.get("expectations", []) if not e["success"]}
    return (code, failed, record) if result else (code, failed)


def test_a_sound_repair_passes_the_gate(tmp_path, smollm2_tok, ids):
    assert run_gate(tmp_path, smollm2_tok, *tables(ids)) == (0, set())


def test_a_repaired_row_whose_bytes_differ_by_one_token_fails(tmp_path, smollm2_tok, ids):
    wrong = list(ids["truth"])
    wrong[-2] = ids["piece"]("poses")
    code, failed = run_gate(tmp_path, smollm2_tok, *tables(ids, after_p1=wrong))
    assert code == 1 and "repaired_bytes_differ" in failed


def test_a_repaired_row_whose_length_misses_the_bill_fails(tmp_path, smollm2_tok, ids):
    p = ids["piece"]
    longer = ids["truth"][:1] + [p(" t"), p("rans"), p("pose"), ids["end"]]
    code, failed = run_gate(tmp_path, smollm2_tok, *tables(ids, after_p1=longer))
    assert code == 1 and "repaired_misses_bill" in failed and "repaired_bytes_differ" not in failed


def test_a_changed_exact_row_fails(tmp_path, smollm2_tok, ids):
    p = ids["piece"]
    hello = ids["hello"]
    resplit = smollm2_tok.encode_ordinary("Hel") + [p("lo")] + hello[1:]
    assert smollm2_tok.decode(resplit) == smollm2_tok.decode(hello)
    code, failed = run_gate(tmp_path, smollm2_tok, *tables(ids, after_p0=resplit))
    assert code == 1 and "exact_row_changed" in failed


def test_the_count_a_stages_confidences_predict_is_the_poisson_binomial_of_them():
    import itertools

    from draftgate.checks.repair import interval, poisson_binomial, quantile

    p = [0.9, 0.5, 0.2, 0.99]
    brute = [0.0] * 5
    for outcome in itertools.product((0, 1), repeat=4):
        brute[sum(outcome)] += math.prod(q if o else 1 - q for q, o in zip(p, outcome))
    assert poisson_binomial(p) == pytest.approx(brute, abs=1e-12)
    assert quantile(poisson_binomial([0.5] * 4), 0.5) == 2 and quantile(poisson_binomial([1.0] * 3), 0.005) == 3
    # The low estimates bound the lower tail, the high ones the upper: ten rows at 0.5-0.9.
    assert interval([0.5] * 10, [0.9] * 10, 0.99) == (1, 10)


def test_rows_made_exact_as_their_confidences_predict_pass_the_calibration(tmp_path, smollm2_tok, ids):
    sure = [(ids["truth"], 0.97, 0.99)] * 8
    code, failed, record = run_gate(tmp_path, smollm2_tok, *tables(ids, repaired=sure), result=True)
    figures = record["computed"]["report"]["calibration"]
    assert code == 0 and failed == set()
    assert (figures["graded_rows"], figures["made_exact_observed"]) == (9, 9)
    assert figures["made_exact_interval_low"] <= 9 <= figures["made_exact_interval_high"]
    # Precision at repair.min_confidence (0: every repaired row) and its coverage of the differing rows.
    assert (figures["precision_at_min_confidence"], figures["coverage_at_min_confidence"]) == (1.0, 1.0)


def test_repaired_rows_flipped_to_another_split_fall_outside_what_their_confidences_predict(tmp_path, smollm2_tok, ids):
    flipped = [(ids["other"], 0.97, 0.99)] * 8          # the same bytes at the bill's length, not the truth
    code, failed, record = run_gate(tmp_path, smollm2_tok, *tables(ids, repaired=flipped), result=True)
    figures = record["computed"]["report"]["calibration"]
    assert code == 1 and "calibration_miss" in failed and "repaired_bytes_differ" not in failed
    assert figures["made_exact_observed"] == 1 < figures["made_exact_interval_low"]
    assert figures["precision_at_min_confidence"] == pytest.approx(1 / 9, abs=1e-4)
    # The stage saying its search was cut on those rows is counted, and excuses nothing.
    code, failed, record = run_gate(tmp_path, smollm2_tok, *tables(ids, repaired=flipped, capped=True), result=True)
    assert code == 1 and "calibration_miss" in failed and record["computed"]["report"]["calibration"]["capped_rows"] == 8


def test_honest_low_confidences_on_those_rows_pass_and_wild_ones_either_way_fail(tmp_path, smollm2_tok, ids):
    honest = [(ids["other"], 0.05, 0.2)] * 8
    assert "calibration_miss" not in run_gate(tmp_path, smollm2_tok, *tables(ids, repaired=honest))[1]
    under = [(ids["truth"], 0.05, 0.2)] * 8           # exact rows the stage called unlikely: too many made exact
    code, failed, record = run_gate(tmp_path, smollm2_tok, *tables(ids, repaired=under), result=True)
    figures = record["computed"]["report"]["calibration"]
    assert code == 1 and failed == {"calibration_miss"} and figures["made_exact_observed"] > figures["made_exact_interval_high"]


def test_without_truth_the_gate_still_reports_the_expected_count_and_the_confidences_in_tenths(tmp_path, smollm2_tok, ids):
    rows = [(ids["other"], 0.97, 0.99)] * 3
    code, failed, record = run_gate(tmp_path, smollm2_tok, *tables(ids, repaired=rows, truth=False), result=True)
    report = record["computed"]["report"]
    assert "calibration_miss" not in failed and report["calibration"]["graded_rows"] == 0
    assert report["calibration"]["expected_made_exact"] == pytest.approx(0.9 + 3 * 0.97)
    tenths = {r["confidence"]: r["repaired_rows"] for r in report["tables"]["confidence_tenths"]["rows"]}
    assert tenths["0.9-1.0"] == 4 and sum(tenths.values()) == 4
    # The gate's page shows both tables whole.
    from draftgate.gates import page

    html = page.write(record, tmp_path / "docs", root=ROOT, dvc_yaml={}).read_text()
    assert "Computed by the gate: confidence_tenths" in html and "expected_made_exact" in html
    # The calibration figures read down the page, one a line, not fourteen columns across.
    shown = report["tables"]["calibration"]
    assert shown["columns"] == ["figure", "value"]
    assert {r["figure"]: r["value"] for r in shown["rows"]} == report["calibration"]
