"""The tokens gate (expectations/tokens.json) on tables reconstructed from small dicts.

Each test runs the real gate (DuckDB view -> GX) through `draftgate validate`'s main and reads
which expectations failed from the result file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from draftgate.gates import validate as gates
from draftgate.config import BillingParams
from draftgate.contract import vocab_table
from draftgate.templates.roles import template_roles
from draftgate.reconstruct.core import Setup
from draftgate.templates import encode_segments, get_template
from reconstruct_fixtures import reconstruct_tables

SUITE = Path(__file__).resolve().parents[1] / "expectations" / "tokens.json"
THRESHOLDS = {"max_billing_delta_rate": 0.0004, "min_row_billing_agreement": 0.98,
              "max_prompt_billing_delta_rate": 0.0004, "min_prompt_billing_agreement": 0.98,
              "max_mismatch_rate": 0.5, "max_semantic": 0, "max_quarantine_rate": 0.05}


def tables(rows, prompts):
    import pyarrow as pa

    from draftgate import schema

    full = [{f: r.get(f) for f in schema.responses().names} for r in rows]
    return pa.Table.from_pylist(full, schema=schema.responses()), pa.Table.from_pylist(prompts)


def prompt(pid):
    return {"prompt_id": pid, "dataset": "chat", "split": "train", "tools": None,
            "messages": json.dumps([{"role": "user", "content": f"Say hello ({pid})."}])}


def resp(pid, content, truth, billed, served=None, billed_prompt=None):
    """A backend's row; `served`: the prompt ids it returned (and billed, unless billed_prompt)."""
    return {"prompt_id": pid, "dataset": "chat", "status": "ok", "finish_reason": "stop",
            "content": content, "provider": "local", "truth_ids": truth, "billed_completion_tokens": billed,
            "prompt_token_ids": served,
            "billed_prompt_tokens": billed_prompt if billed_prompt is not None else (len(served) if served else None)}


def served_prompt(tok, template, pid, tools=None):
    """The prompt ids a serving engine would return for prompt(pid)."""
    t = get_template(template)
    segs = t.render_prompt(json.loads(prompt(pid)["messages"]), tools, False)
    return encode_segments(tok, [segs], names(tok, template))[0]


def run_gate(tmp_path, tok, template, ids, rows, prompts, corrupt=None, billing=None, rules=(), **thresholds):
    """Reconstruct, optionally corrupt the tokens table (`corrupt(table) -> table`), gate it."""
    responses, prompts = tables(rows, prompts)
    setup = Setup(tok, get_template(template), ids, False, request_rules=tuple(rules))
    table, _, _ = reconstruct_tables(responses, prompts, setup, billing_params=billing)
    if corrupt is not None:
        table = corrupt(table)
    return gate(tmp_path, tok, table, responses, template, ids, prompts, **thresholds) + (table,)


_VOCABS: dict = {}


def gate(tmp_path, tok, table, responses, template, ids, prompts, **thresholds):
    import pyarrow.parquet as pq

    pq.write_table(table, tmp_path / "tokens.parquet")
    pq.write_table(responses, tmp_path / "responses.parquet")
    pq.write_table(prompts, tmp_path / "prompts.parquet")
    # The contract as the contract stage writes it: the verified ids by role.
    (tmp_path / "contract.json").write_text(json.dumps(
        {"special_ids": ids, "roles": template_roles(get_template(template), ids)}))
    if tok.name not in _VOCABS:
        _VOCABS[tok.name] = vocab_table(tok)
    pq.write_table(_VOCABS[tok.name], tmp_path / "vocab.parquet")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"gates": {"tokens": {**THRESHOLDS, **thresholds}}}))
    code = gates.main([str(SUITE), str(tmp_path / "tokens.parquet"), "--result", str(tmp_path / "r.json"),
                       "--input", f"responses={tmp_path / 'responses.parquet'}",
                       "--input", f"contract={tmp_path / 'contract.json'}",
                       "--input", f"vocab={tmp_path / 'vocab.parquet'}",
                       "--input", f"prompts={tmp_path / 'prompts.parquet'}",
                       "--params", str(tmp_path / "params.yaml"), "--no-docs"])
    result = json.loads((tmp_path / "r.json").read_text())
    failed = {e["kwargs"].get("column") for e in result["expectations"] if not e["success"]}
    return code, failed


def names(tok, template):
    return {n: tok.token_id(n) for n in get_template(template).special_names}


def greetings(tok) -> tuple[list[dict], list[dict]]:
    """Three sound Qwen3 rows, truth ids and agreeing bills (p0..p2), with their prompts: the rows
    the gate tests here and the page drills (test_gates_page, test_gates_evidence_page) start from."""
    texts = ["Hello!", "Hi there.", "Hello, world."]
    rows = []
    for k, text in enumerate(texts):
        truth = tok.encode(text + "<|im_end|>")
        rows.append(resp(f"p{k}", text, truth, len(truth), served_prompt(tok, "qwen3", f"p{k}")))
    return rows, [prompt(f"p{k}") for k in range(len(texts))]


@pytest.fixture()
def good_rows(qwen3_tok):
    return greetings(qwen3_tok)


def test_sound_exact_rows_with_agreeing_bills_pass_the_gate(tmp_path, qwen3_tok, good_rows):
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), *good_rows)
    assert (code, failed) == (0, set())


def test_the_163533_replay_fails_the_gate(tmp_path, kimi_standin_tok):
    # A contract whose <|im_end|> is 163533 (an ordinary token on Kimi) against truth ids that
    # end with the real 163586.
    tok = kimi_standin_tok
    rows, prompts = [], []
    for k, text in enumerate(["Hello!", "Hi there."]):
        truth = tok.encode(text + "<|im_end|>")
        rows.append(resp(f"p{k}", text, truth, len(truth)))
        prompts.append(prompt(f"p{k}"))
    ids = names(tok, "kimi_k25") | {"<|im_end|>": 163533}
    code, failed, table = run_gate(tmp_path, tok, "kimi_k2", ids, rows, prompts)
    assert code == 1
    assert {"n_semantic", "quarantine_rate"} <= failed
    assert set(table.column("match").to_pylist()) == {"semantic"}


def test_a_contract_id_that_text_can_produce_shows_up_as_a_special_id_in_text(tmp_path, qwen3_tok):
    # On Qwen3, point <|im_end|> at the ordinary token "Hello": content "Hello" encodes to it.
    hello = qwen3_tok.encode_ordinary("Hello")
    assert len(hello) == 1
    ids = names(qwen3_tok, "qwen3") | {"<|im_end|>": hello[0]}
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", ids,
                               [resp("p0", "Hello", None, 2)], [prompt("p0")], max_quarantine_rate=1.0)
    assert code == 1
    assert "special_id_in_text" in failed


def test_billing_that_disagrees_beyond_the_aggregate_threshold_fails(tmp_path, qwen3_tok, good_rows):
    rows, prompts = good_rows
    rows = [dict(r, billed_completion_tokens=r["billed_completion_tokens"] + 1) for r in rows]
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), rows, prompts,
                               billing=BillingParams(completion={"*": "counts_end"}))
    assert code == 1
    assert failed == {"kept_billing_residual", "billing_row_agreement"}


def test_bills_that_fit_no_convention_and_none_declared_fail_naming_the_provider(tmp_path, qwen3_tok, good_rows):
    rows, prompts = good_rows
    rows = [dict(r, billed_completion_tokens=r["billed_completion_tokens"] + 1) for r in rows]
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), rows, prompts)
    assert code == 1 and "completion_convention_unknown" in failed


def test_a_semantic_row_where_truth_is_known_fails_and_the_mismatch_rate_is_per_dataset(tmp_path, qwen3_tok, good_rows):
    rows, prompts = good_rows
    truth = qwen3_tok.encode("Hello!  <|im_end|>")   # the provider trimmed two spaces
    rows = rows + [resp("p9", "Hello!", truth, len(truth))]
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), rows,
                               prompts + [prompt("p9")], max_mismatch_rate=0.2)
    assert code == 1
    assert failed == {"n_semantic", "dataset_mismatch_rate"}


# ---------------------------------------------------------------- the gate recomputes: corrupt ids, not flags

def edit(table, pid, completion=None, prompt_extra=(), loss_mask=None):
    """The same row with other ids, kept self-consistent (input = prompt + completion, the mask on
    the completion), while every column the reconstruct stage wrote about the row stays as it was."""
    import pyarrow as pa

    rows = table.to_pylist()
    for r in rows:
        if r["prompt_id"] != pid:
            continue
        prompt = r["input_ids"][:r["prompt_len"]]
        prompt = prompt[:1] + list(prompt_extra) + prompt[1:]
        comp = completion(r["completion_ids"]) if completion else r["completion_ids"]
        r["completion_ids"], r["input_ids"] = comp, prompt + comp
        r["loss_mask"] = loss_mask or [0] * len(prompt) + [1] * len(comp)
        r["prompt_len"] = len(prompt)
    return pa.Table.from_pylist(rows, schema=table.schema)


def qwen3_id(tok, name):
    return tok.token_id(name)


@pytest.mark.parametrize("corruption, check", [
    (lambda tok: dict(completion=lambda c: c[:-1]), "kept_without_end_token"),
    (lambda tok: dict(completion=lambda c: c[:1] + [qwen3_id(tok, "</think>")] + c[1:]), "kept_think_unbalanced"),
    (lambda tok: dict(completion=lambda c: c[:1] + [qwen3_id(tok, "<tool_call>")] + c[1:]), "kept_tool_markers_unbalanced"),
    (lambda tok: dict(completion=lambda c: c[:1] + [qwen3_id(tok, "<|im_start|>")] + c[1:]), "special_id_in_text"),
    (lambda tok: dict(completion=lambda c: c[:1] + [qwen3_id(tok, "<|im_end|>")] + c[1:]), "special_id_in_text"),
    (lambda tok: dict(loss_mask=[1] * 40), "kept_bad_shape"),
])
def test_ids_corrupted_behind_the_producers_flags_fail_the_gate(tmp_path, qwen3_tok, good_rows, corruption, check):
    code, failed, table = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), *good_rows,
                                   corrupt=lambda t: edit(t, "p1", **corruption(qwen3_tok)))
    row = table.to_pylist()[1]
    # What the producer said about the row is untouched: only the ids changed.
    assert (row["ends_with_eos"], row["think_balanced"], row["tool_markers_balanced"],
            row["special_in_text"], row["billing_residual"]) == (True, True, True, False, 0)
    assert code == 1 and check in failed


def test_a_bill_altered_in_the_responses_fails_although_the_tokens_table_still_says_it_agrees(
        tmp_path, qwen3_tok, good_rows):
    import pyarrow as pa

    rows, prompts = good_rows
    responses, prompts_t = tables(rows, prompts)
    ids = names(qwen3_tok, "qwen3")
    table, _, _ = reconstruct_tables(responses, prompts_t, Setup(qwen3_tok, get_template("qwen3"), ids, False))
    bills = responses.column("billed_completion_tokens").to_pylist()
    bills[0] += 7
    responses = responses.set_column(responses.schema.get_field_index("billed_completion_tokens"),
                                     "billed_completion_tokens", pa.array(bills, pa.int64()))
    assert set(table.column("billing_residual").to_pylist()) == {0}
    code, failed = gate(tmp_path, qwen3_tok, table, responses, "qwen3", ids, prompts_t)
    assert code == 1 and {"kept_billing_residual", "billing_row_agreement"} <= failed


def test_a_systematic_off_by_one_fails_instead_of_switching_the_convention(tmp_path, qwen3_tok, good_rows):
    # Every completion one id longer than what was billed (an extra token before the end), as a
    # reconstruction bug would make it: the learned convention (counts_end, from the truth rows
    # as they were) stays in the table; excludes_end would fit every corrupted row.
    pad = qwen3_tok.encode_ordinary(" ")[0]

    def longer(t):
        for pid in ("p0", "p1", "p2"):
            t = edit(t, pid, completion=lambda c: c[:-1] + [pad] + c[-1:])
        return t
    code, failed, table = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), *good_rows, corrupt=longer)
    assert set(table.column("billing_convention").to_pylist()) == {"counts_end"}
    assert code == 1
    assert {"completion_convention_disagrees", "billing_row_agreement", "kept_billing_residual"} <= failed


def test_a_default_system_turn_inserted_by_mistake_fails_prompt_billing(tmp_path, qwen3_tok, good_rows):
    # The provider billed the prompt it rendered (no system turn); our prompt carries one more turn.
    extra = qwen3_tok.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    code, failed, _ = run_gate(
        tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), *good_rows,
        corrupt=lambda t: edit(edit(edit(t, "p0", prompt_extra=extra), "p1", prompt_extra=extra), "p2", prompt_extra=extra))
    assert code == 1
    assert {"kept_prompt_residual", "prompt_billing_row_agreement", "prompt_offset_disagrees"} <= failed


STRICT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                                                "strict": False}}


def test_tool_prompts_are_billed_as_providers_render_them_only_with_the_strict_rule(tmp_path, qwen3_tok):
    # Recorded-like: Qwen3 on Novita/DeepInfra bills the request without "strict" (5 tokens per tool fewer).
    loose = {**STRICT_TOOL, "function": {k: v for k, v in STRICT_TOOL["function"].items() if k != "strict"}}
    billed_prompt = len(served_prompt(qwen3_tok, "qwen3", "p0", [loose]))
    # 4 tokens here (', "strict": false' before the closing braces); 5 in the recorded requests.
    assert len(served_prompt(qwen3_tok, "qwen3", "p0", [STRICT_TOOL])) - billed_prompt == 4
    truth = qwen3_tok.encode("Sunny.<|im_end|>")
    rows = [dict(resp("p0", "Sunny.", truth, len(truth), billed_prompt=billed_prompt), provider="Novita")]
    prompts = [dict(prompt("p0"), tools=json.dumps([STRICT_TOOL]))]
    declared = BillingParams(completion={"*": "counts_end"}, prompt={"novita": 0})
    ids = names(qwen3_tok, "qwen3")
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", ids, rows, prompts, billing=declared,
                               rules=["drop_function_strict"])
    assert (code, failed) == (0, set())
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", ids, rows, prompts, billing=declared)
    assert code == 1 and {"kept_prompt_residual", "prompt_billing_row_agreement"} <= failed


def test_text_ids_that_spell_other_text_fail_as_semantic_although_the_row_says_exact(tmp_path, qwen3_tok, good_rows):
    import pyarrow as pa

    other = qwen3_tok.encode("Hi there!<|im_end|>")     # truth spells "Hi there."

    def swap(t):
        rows = t.to_pylist()
        rows[1]["text_ids"] = other
        return pa.Table.from_pylist(rows, schema=t.schema)
    code, failed, table = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), *good_rows,
                                   corrupt=swap, max_mismatch_rate=0.2)
    assert table.column("match").to_pylist()[1] == "exact"
    assert code == 1 and failed == {"n_semantic", "dataset_mismatch_rate"}


# ---------------------------------------------------------------- blind spots: the prompt ids, the split

def replace_in_prompt(table, pid, old, new):
    """Row `pid` with the prompt id `old` replaced by `new` (same length: every count stays)."""
    import pyarrow as pa

    rows = table.to_pylist()
    for r in rows:
        if r["prompt_id"] == pid:
            prompt = r["input_ids"][:r["prompt_len"]]
            assert old in prompt
            r["input_ids"] = [new if i == old else i for i in prompt] + r["input_ids"][r["prompt_len"]:]
    return pa.Table.from_pylist(rows, schema=table.schema)


def observed(tmp_path, column):
    result = json.loads((tmp_path / "r.json").read_text())
    [e] = [e for e in result["expectations"] if e["kwargs"].get("column") == column]
    return e["observed_value"]


def test_a_role_swapped_in_the_prompt_fails_against_the_ids_the_backend_served(tmp_path, qwen3_tok, good_rows):
    # "user" -> "system": one ordinary id for another, so the prompt's length, its bill and every
    # completion check still agree; only the served prompt ids tell.
    [user], [system] = qwen3_tok.encode_ordinary("user"), qwen3_tok.encode_ordinary("system")
    code, failed, table = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), *good_rows,
                                   corrupt=lambda t: replace_in_prompt(t, "p1", user, system))
    assert table.column("quarantine_reason").to_pylist() == [None] * 3
    assert (code, failed) == (1, {"kept_prompt_differs_from_served"})
    assert observed(tmp_path, "prompt_ids_compared") == 3


def test_a_backend_that_returns_no_prompt_ids_passes_and_the_result_says_nothing_was_compared(tmp_path, qwen3_tok, good_rows):
    rows, prompts = good_rows
    rows = [dict(r, prompt_token_ids=None) for r in rows]     # a text-only API: bills, no ids
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), rows, prompts,
                               billing=BillingParams(prompt={"*": 0}))   # no ids to learn the offset from
    assert (code, failed) == (0, set())
    assert observed(tmp_path, "prompt_ids_compared") == 0


def test_a_heldout_row_relabelled_train_fails_against_the_prompts_table(tmp_path, qwen3_tok, good_rows):
    import pyarrow as pa
    import pyarrow.compute as pc

    rows, prompts = good_rows
    prompts = [dict(p, split="heldout") if p["prompt_id"] == "p1" else p for p in prompts]

    def relabel(t):
        return t.set_column(t.schema.get_field_index("split"), "split",
                            pa.array(["train"] * t.num_rows, t.schema.field("split").type))
    code, failed, table = run_gate(tmp_path, qwen3_tok, "qwen3", names(qwen3_tok, "qwen3"), rows, prompts,
                                   corrupt=relabel)
    assert pc.all(pc.equal(table.column("split"), "train")).as_py()
    assert (code, failed) == (1, {"split_differs_from_prompts"})
    [e] = [e for e in json.loads((tmp_path / "r.json").read_text())["expectations"]
           if e["kwargs"].get("column") == "split_differs_from_prompts"]
    assert e["unexpected_sample"] == ["p1: train here, heldout in prompts.parquet"]
