import json

import pytest

from draftgate.config import ContractParams
from draftgate.contract import ContractError, check_contract, template_special_names
from stages.contract import main

# DeepSeek-V4 has no template here (draftgate.templates refuses it); these are the reasoning and
# tool-call names its tokenizer carries (docs/tokenizers.md).
DEEPSEEK_NAMES = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                  "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                  "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"]
FACTS_PAIRS = ContractParams().probe_pairs


def contract(tok, names, expected=None, pairs=(), template=None):
    return check_contract(tok, names, expected or {}, list(pairs), template=template)


# ---------------------------------------------------------------- passing contracts

def test_contract_passes_on_qwen3_for_every_name_of_the_qwen3_template(qwen3_tok):
    r = contract(qwen3_tok, template_special_names("qwen3"), template="qwen3")
    assert r.ok, [c.problem for c in r.failures()]
    assert r.special_ids["<|im_end|>"] == 151645 and r.special_ids["<think>"] == 151667
    assert len(r.special_ids) == len(template_special_names("qwen3"))


def test_contract_passes_on_smollm2_for_chatml(smollm2_tok):
    r = contract(smollm2_tok, template_special_names("chatml"), template="chatml")
    assert r.ok and r.special_ids == {"<|im_start|>": 1, "<|im_end|>": 2}


def test_contract_passes_on_the_kimi_standin_for_the_kimi_k2_template(kimi_standin_tok):
    r = contract(kimi_standin_tok, template_special_names("kimi_k25"), template="kimi_k2")
    assert r.ok, [c.problem for c in r.failures()]
    assert r.special_ids["<|im_end|>"] == 163586 and r.special_ids["<|tool_call_argument_begin|>"] == 163598


def test_contract_passes_on_deepseek_for_its_think_and_tool_names(deepseek_tok):
    r = contract(deepseek_tok, DEEPSEEK_NAMES)
    assert r.ok, [c.problem for c in r.failures()]
    assert r.special_ids["<think>"] == 128821 and r.special_ids["<｜tool▁sep｜>"] == 128814


# ---------------------------------------------------------------- failing contracts

def test_contract_rejects_im_end_163533_naming_the_real_id_and_what_163533_is(kimi_standin_tok):
    r = contract(kimi_standin_tok, template_special_names("kimi_k25"), {"<|im_end|>": 163533})
    assert not r.ok
    (bad,) = r.failures()
    assert (bad.name, bad.id, bad.expected_id, bad.reasons) == ("<|im_end|>", 163586, 163533, ("expected_id_mismatch",))
    # On real Kimi-K2 163533 decodes to "chas"; on the stand-in it is an ordinary filler piece.
    assert bad.expected_decodes_to == "'<kimi-standin-163533>' (an ordinary token)"
    assert "'<|im_end|>' = 163586" in bad.problem and "id 163533 is '<kimi-standin-163533>'" in bad.problem
    assert "set tokenizer.expected_ids.<|im_end|> to 163586" in bad.problem
    assert "<|im_end|>" not in r.special_ids      # an unverified id never reaches reconstruction


def test_an_expected_id_that_agrees_passes_and_one_outside_the_vocabulary_says_so(qwen3_tok):
    assert contract(qwen3_tok, ["<|im_end|>"], {"<|im_end|>": 151645}).ok
    (bad,) = contract(qwen3_tok, ["<|im_end|>"], {"<|im_end|>": 10**6}).failures()
    assert "id 1000000 is outside the vocabulary (0..151668)" in bad.problem


@pytest.mark.parametrize("piece", ["hello", "chas"])
def test_an_ordinary_piece_given_as_a_special_name_fails_as_not_an_added_token(qwen3_tok, piece):
    (bad,) = contract(qwen3_tok, ["<|im_end|>", piece]).failures()
    # It round-trips like a special token would: only the added-token check catches it.
    assert bad.single_id and bad.decodes_to == piece
    assert bad.reasons == ("not_added_token",) and "ordinary vocabulary piece" in bad.problem


def test_the_kimi_template_on_the_qwen3_tokenizer_fails_on_every_kimi_only_name(qwen3_tok):
    r = contract(qwen3_tok, template_special_names("kimi_k25"), template="kimi_k25")
    missing = {c.name for c in r.failures() if c.reasons == ("not_in_vocabulary",)}
    assert {"<|im_middle|>", "<|im_assistant|>", "<|tool_call_begin|>"} <= missing
    assert {c.name for c in r.checks if c.ok} == {"<|im_end|>", "<think>", "</think>"}


def test_an_added_token_that_strips_its_neighbours_fails_the_isolation_check(smollm2_tok):
    from tokenizers import Tokenizer as Core
    from transformers import PreTrainedTokenizerFast

    from draftgate.tokenizers import Tokenizer

    spec = json.loads(smollm2_tok.hf.backend_tokenizer.to_str())
    for t in spec["added_tokens"]:
        if t["content"] == "<|im_end|>":
            t["rstrip"] = True          # swallows the whitespace after it, like some Llama tokens
    tok = Tokenizer(PreTrainedTokenizerFast(tokenizer_object=Core.from_str(json.dumps(spec))), "smollm2")
    (bad,) = contract(tok, ["<|im_start|>", "<|im_end|>"]).failures()
    assert bad.name == "<|im_end|>" and bad.reasons == ("text_not_isolated",)


# ---------------------------------------------------------------- boundary probe

def test_boundary_probe_records_the_facts_md_merges_on_qwen3(qwen3_tok):
    probes = {(p.a, p.b): p for p in contract(qwen3_tok, ["<|im_end|>"], pairs=FACTS_PAIRS).boundary_probe}
    foo = probes[("foo", "bar")]
    assert (foo.a_ids, foo.b_ids, foo.joined_ids, foo.merges) == ((7975,), (2257,), (50267,), True)
    answer = probes[("The answer is 42.", "\n\nThe")]
    assert answer.a_ids[-1] == 13 and answer.b_ids[0] == 271 and 382 in answer.joined_ids and answer.merges
    assert probes[("x = (", "))")].joined_ids[-1] == 44481
    assert not probes[("hello", " world")].merges


def test_a_probe_pair_that_is_not_a_pair_is_an_error_naming_its_index(qwen3_tok):
    with pytest.raises(ContractError, match=r"contract.probe_pairs\[1\] must be a pair"):
        contract(qwen3_tok, ["<|im_end|>"], pairs=[["a", "b"], ["only one"]])


def test_result_json_has_the_documented_shape(qwen3_tok):
    d = contract(qwen3_tok, ["<|im_end|>", "hello"], pairs=[["foo", "bar"]], template="qwen3").to_dict()
    assert set(d) == {"tokenizer", "template", "special_ids", "checks", "boundary_probe", "ok", "roles",
                      "template_contract", "template_probes"}
    assert set(d["tokenizer"]) == {"kind", "name", "fingerprint", "vocab_size"}
    assert set(d["checks"][0]) >= {"name", "id", "decodes_to", "reencodes_to", "single_id", "is_added_token",
                                   "expected_id", "ok", "problem"}
    assert d["special_ids"] == {"<|im_end|>": 151645} and d["ok"] is False
    assert d["boundary_probe"] == [{"a": "foo", "b": "bar", "a_ids": [7975], "b_ids": [2257],
                                    "joined_ids": [50267], "merges": True}]
    json.dumps(d)


# ---------------------------------------------------------------- stage CLI + gate suite

def write_params(tmp_path, expected=None):
    import yaml

    doc = {"tokenizer": {"kind": "smollm2", "expected_ids": expected or {}}, "template": {"name": "chatml"}}
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return p


def run_stage(tmp_path, expected=None):
    out, metrics = tmp_path / "data" / "contract" / "contract.json", tmp_path / "metrics" / "contract.json"
    rc = main(["--params", str(write_params(tmp_path, expected)), "--out", str(out), "--metrics", str(metrics)])
    return rc, out, metrics


def test_stage_exits_0_and_writes_the_contract_and_metrics_atomically(tmp_path):
    rc, out, metrics = run_stage(tmp_path)
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["template"] == "chatml" and doc["special_ids"] == {"<|im_end|>": 2, "<|im_start|>": 1}
    from draftgate.metrics import details_path

    m = json.loads(metrics.read_text())                   # numbers only (a DVC metric)
    d = json.loads(details_path(metrics).read_text())     # the text beside them
    assert (d["stage"], m["rows_in"], m["rows_out"], m["dropped"], m["ok"]) == ("contract", 2, 2, 0, True)
    assert len(doc["boundary_probe"]) == len(FACTS_PAIRS)
    assert m["boundary_merges"] == sum(p["merges"] for p in doc["boundary_probe"])
    assert d["params"]["tokenizer"]["kind"] == "smollm2"
    assert sorted(p.name for p in out.parent.iterdir()) == ["contract.json"]   # no temp file left
    # The template contract ran against the template embedded in the GGUF, and passed.
    tc = doc["template_contract"]
    assert tc["ok"] and tc["compared"] >= 5 and tc["official"]["source"].endswith("tokenizer.chat_template")
    assert {**m, **d}["template_contract"]["compared"] == tc["compared"]
    assert doc["roles"]["end_id"] == 2


def test_stage_exits_1_after_writing_the_json_and_prints_each_failure_with_its_fix(tmp_path, capsys):
    rc, out, metrics = run_stage(tmp_path, expected={"<|im_end|>": 0})
    assert rc == 1
    doc = json.loads(out.read_text())
    assert doc["ok"] is False and doc["special_ids"] == {"<|im_start|>": 1}
    err = capsys.readouterr().err
    assert "FAIL '<|im_end|>' [expected_id_mismatch]" in err and "set tokenizer.expected_ids.<|im_end|> to 2" in err
    assert json.loads(metrics.read_text())["drops_by_reason"] == {"expected_id_mismatch": 1}


def test_stage_can_defer_a_failing_contract_to_the_gate(tmp_path):
    params = write_params(tmp_path, {"<|im_end|>": 0})
    out = tmp_path / "c.json"
    assert main(["--params", str(params), "--out", str(out), "--defer-to-gate"]) == 0
    assert json.loads(out.read_text())["ok"] is False


def test_stage_exits_2_with_the_reason_when_the_tokenizer_cannot_be_loaded(tmp_path, capsys):
    p = tmp_path / "params.yaml"
    p.write_text("tokenizer: {kind: hf_dir}\ntemplate: {name: chatml}\n")
    assert main(["--params", str(p), "--out", str(tmp_path / "c.json")]) == 2
    assert "tokenizer.path is not set" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_the_draftgate_console_script_dispatches_contract(tmp_path):
    from draftgate.cli import main as cli

    out = tmp_path / "c.json"
    assert cli(["contract", "--params", str(write_params(tmp_path)), "--out", str(out)]) == 0 and out.exists()


def test_the_contract_suite_passes_a_good_contract_and_fails_a_bad_one_in_the_gate(tmp_path, kimi_standin_tok):
    from draftgate.gates.validate import main as validate

    import pyarrow.parquet as pq

    from draftgate.contract import vocab_table

    vocab = tmp_path / "vocab.parquet"
    pq.write_table(vocab_table(kimi_standin_tok), vocab)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(contract(kimi_standin_tok, template_special_names("kimi_k25")).to_dict()))
    assert validate(["expectations/contract.json", str(good), "--input", f"vocab={vocab}", "--no-docs"]) == 0
    bad = tmp_path / "bad.json"
    r = contract(kimi_standin_tok, [*template_special_names("kimi_k25"), "hello", "<|nope|>"], {"<|im_end|>": 163533})
    bad.write_text(json.dumps(r.to_dict()))
    result = tmp_path / "gate.json"
    assert validate(["expectations/contract.json", str(bad), "--input", f"vocab={vocab}", "--no-docs",
                     "--result", str(result)]) == 1
    failed = {(e["type"], e["kwargs"].get("column")) for e in json.loads(result.read_text())["expectations"]
              if not e["success"]}
    assert failed == {("expect_column_values_to_not_be_null", "id"),
                      ("expect_column_pair_values_to_be_equal", None),
                      ("expect_column_values_to_be_in_set", "single_id"),
                      ("expect_column_values_to_be_in_set", "is_added_token"),
                      ("expect_column_values_to_be_in_set", "isolates_text"),
                      ("expect_column_values_to_be_null", "problem"),
                      ("expect_column_values_to_be_in_set", "ok"),
                      # Recomputed from the vocabulary's added-token table: "hello" is an ordinary piece.
                      ("expect_column_values_to_be_null", "vocab_not_added")}


def test_the_contract_gate_recomputes_from_the_vocabulary_not_from_the_stages_verdicts(tmp_path, kimi_standin_tok):
    # A contract whose rows were edited to claim <|im_end|> = 163533 with every verdict left "ok".
    import pyarrow.parquet as pq

    from draftgate.contract import vocab_table
    from draftgate.gates.validate import main as validate

    vocab = tmp_path / "vocab.parquet"
    pq.write_table(vocab_table(kimi_standin_tok), vocab)
    doc = contract(kimi_standin_tok, template_special_names("kimi_k25")).to_dict()
    for c in doc["checks"]:
        if c["name"] == "<|im_end|>":
            c["id"] = 163533
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(doc))
    result = tmp_path / "gate.json"
    assert validate(["expectations/contract.json", str(forged), "--input", f"vocab={vocab}", "--no-docs",
                     "--result", str(result)]) == 1
    failed = {e["kwargs"].get("column") for e in json.loads(result.read_text())["expectations"] if not e["success"]}
    assert failed == {"vocab_spells_other", "vocab_not_added"}
