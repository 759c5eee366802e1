"""The repair gate (expectations/repair.json) on small tables of real SmolLM2 ids: it
passes a sound repair and fails, by name, a repaired row whose bytes differ by one token, one
whose length misses the bill, and a changed exact row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftgate.gates import validate as gates

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
    assert tok.decode(truth) == tok.decode(canon) and len(truth) == len(canon) + 1
    return {"end": end, "hello": hello, "canon": canon, "truth": truth, "piece": piece}


def tables(ids, after_p1=None, after_p0=None):
    import pyarrow as pa

    from draftgate import schema
    from draftgate.repair.run import schema as repaired_schema

    prompt = [1, 2, 3]

    def tok_row(pid, completion, method="text", text_ids=None):
        return {"prompt_id": pid, "dataset": "code", "split": "train", "input_ids": prompt + completion,
                "prompt_len": len(prompt), "completion_ids": completion,
                "loss_mask": [0] * len(prompt) + [1] * len(completion), "method": method,
                "billing_convention": "counts_end", "provider": "local", "text_ids": text_ids,
                "repair_status": "repaired" if method == "repaired" else "kept",
                "repair_reason": None if method == "repaired" else "canonical"}

    before = [tok_row("p0", ids["hello"]), tok_row("p1", ids["canon"])]
    p1 = after_p1 or ids["truth"]
    after = [tok_row("p0", after_p0 or ids["hello"], "repaired" if after_p0 else "text"),
             tok_row("p1", p1, "repaired", ids["canon"])]
    responses = [{"prompt_id": "p0", "status": "ok", "truth_ids": ids["hello"],
                  "billed_completion_tokens": len(ids["hello"])},
                 {"prompt_id": "p1", "status": "ok", "truth_ids": ids["truth"],
                  "billed_completion_tokens": len(ids["truth"])}]
    return (pa.Table.from_pylist(after, schema=repaired_schema()),
            pa.Table.from_pylist([{k: v for k, v in r.items() if not k.startswith("repair_")} for r in before],
                                 schema=schema.tokens()),
            pa.Table.from_pylist(responses, schema=schema.responses()))


def run_gate(tmp_path, tok, after, before, responses):
    import pyarrow.parquet as pq

    from draftgate.contract import vocab_table
    from draftgate.templates.roles import template_roles
    from draftgate.templates import get_template

    for name, t in (("tokens", after), ("before", before), ("responses", responses)):
        pq.write_table(t, tmp_path / f"{name}.parquet")
    names = {n: tok.token_id(n) for n in get_template("chatml").special_names}
    (tmp_path / "contract.json").write_text(json.dumps(
        {"special_ids": names, "roles": template_roles(get_template("chatml"), names)}))
    pq.write_table(vocab_table(tok), tmp_path / "vocab.parquet")
    code = gates.main([str(SUITE), str(tmp_path / "tokens.parquet"), "--result", str(tmp_path / "r.json"),
                       "--input", f"before={tmp_path / 'before.parquet'}",
                       "--input", f"responses={tmp_path / 'responses.parquet'}",
                       "--input", f"contract={tmp_path / 'contract.json'}",
                       "--input", f"vocab={tmp_path / 'vocab.parquet'}", "--params", str(PARAMS), "--no-docs"])
    result = json.loads((tmp_path / "r.json").read_text())
    return code, {e["kwargs"].get("column") for e in result["expectations"] if not e["success"]}


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
