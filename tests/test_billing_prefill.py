"""A provider that prefills the think opener: declared in reconstruct.billing.prefill, moved from
the completion to the prompt by the reconstruct stage, and held by the tokens gate's billing
checks, which recompute both lengths from the ids.

The provider here is scripted ("prefiller"): it bills the Qwen3 prompt plus `<think>` and returns
reasoning that starts with the newline the model wrote after it, the shape FACTS.md records for a
Fireworks Qwen3 bill (that bill itself is not in this repository, so no provider is named).
"""

from __future__ import annotations

import json

import pytest

from draftgate.config import BillingParams
from draftgate.reconstruct.billing_prefill import PrefillError, resolve
from draftgate.reconstruct.core import Setup
from draftgate.reconstruct.inputs import InputError
from draftgate.templates import encode_segments, get_template
from reconstruct_fixtures import reconstruct_tables
from test_reconstruct_gate import gate, names, prompt, tables

TEXTS = [("The user greets.", "Hello!"), ("A greeting.", "Hi there."), ("Say hello back.", "Hello, world.")]


def qwen3_prompt_ids(tok, pid, thinking=True):
    segs = get_template("qwen3").render_prompt(json.loads(prompt(pid)["messages"]), None, thinking)
    return encode_segments(tok, [segs], names(tok, "qwen3"))[0]


def prefilled_rows(tok, provider="prefiller", prefill="<think>"):
    """What a prefilling provider returns and bills: the prompt + the opener; the rest is completion."""
    rows = []
    for k, (reasoning, content) in enumerate(TEXTS):
        generated = tok.encode(f"\n{reasoning}\n</think>\n\n{content}<|im_end|>")
        rows.append({"prompt_id": f"p{k}", "dataset": "chat", "status": "ok", "finish_reason": "stop",
                     "provider": provider, "reasoning": "\n" + reasoning, "content": content,
                     "billed_completion_tokens": len(generated),
                     "billed_prompt_tokens": len(qwen3_prompt_ids(tok, f"p{k}")) + len(tok.encode(prefill))})
    return rows, [prompt(f"p{k}") for k in range(len(TEXTS))]


def run(tmp_path, tok, rows, prompts, billing, thinking=True):
    responses, prompts_t = tables(rows, prompts)
    ids = names(tok, "qwen3")
    setup = Setup(tok, get_template("qwen3"), ids, thinking,
                  prefill=resolve(tok, ids, billing.prefill))
    table, result, _ = reconstruct_tables(responses, prompts_t, setup, billing_params=billing)
    code, failed = gate(tmp_path, tok, table, responses, "qwen3", ids, prompts_t)
    return code, failed, table, result


def declared(**prefill):
    return BillingParams(completion={"*": "counts_end"}, prompt={"*": 0}, prefill=prefill)


def test_a_prefill_resolves_by_name_to_the_ids_the_tokenizer_gives_its_text(qwen3_tok):
    ids = names(qwen3_tok, "qwen3")
    got = resolve(qwen3_tok, ids, {"Prefiller": "<think>\n", "other": "<think>"})
    # Keys case-folded as every billing table's; ids equal the full-string encode with specials parsed.
    assert got == {"prefiller": tuple(qwen3_tok.encode("<think>\n")), "other": (ids["<think>"],)}
    assert resolve(qwen3_tok, ids, {}) == {}


@pytest.mark.parametrize("text, why", [("Sure, ", "holds no special token"), ("", "give the text")])
def test_a_prefill_that_opens_no_think_block_is_refused_naming_the_param(qwen3_tok, text, why):
    with pytest.raises(PrefillError, match=rf"reconstruct\.billing\.prefill\.x .*{why}"):
        resolve(qwen3_tok, names(qwen3_tok, "qwen3"), {"x": text})
    # The stage reports it as it reports any input it cannot use: the message, exit 1.
    assert issubclass(PrefillError, InputError)


def test_a_declared_prefill_moves_the_opener_into_the_prompt_and_both_bills_agree(tmp_path, qwen3_tok):
    rows, prompts = prefilled_rows(qwen3_tok)
    code, failed, table, _ = run(tmp_path, qwen3_tok, rows, prompts, declared(prefiller="<think>"))
    assert (code, failed) == (0, set())
    row = table.slice(0, 1).to_pylist()[0]
    think = qwen3_tok.token_id("<think>")
    prompt_ids = qwen3_prompt_ids(qwen3_tok, "p0")
    # The sequence the model saw is unchanged; only where the loss starts moved past the opener.
    assert row["input_ids"][:len(prompt_ids) + 1] == prompt_ids + [think]
    assert row["prompt_len"] == len(prompt_ids) + 1 == row["loss_mask"].index(1)
    assert row["completion_ids"] == qwen3_tok.encode("\nThe user greets.\n</think>\n\nHello!<|im_end|>")


def test_without_the_rule_the_prefilling_provider_fails_prompt_and_completion_billing(tmp_path, qwen3_tok):
    rows, prompts = prefilled_rows(qwen3_tok)
    code, failed, _, _ = run(tmp_path, qwen3_tok, rows, prompts, declared())
    assert code == 1
    assert {"kept_prompt_residual", "prompt_billing_row_agreement",
            "kept_billing_residual", "billing_row_agreement"} <= failed


def test_a_prompt_offset_of_one_absorbs_the_prompt_half_only_so_a_prefill_is_not_an_offset(tmp_path, qwen3_tok):
    rows, prompts = prefilled_rows(qwen3_tok)
    offset = BillingParams(completion={"*": "counts_end"}, prompt={"*": 1})
    code, failed, _, _ = run(tmp_path, qwen3_tok, rows, prompts, offset)
    assert code == 1 and "kept_prompt_residual" not in failed
    assert {"kept_billing_residual", "billing_row_agreement"} <= failed


def test_a_prefill_declared_for_a_provider_that_does_not_prefill_fails_the_gate(tmp_path, qwen3_tok):
    # This provider bills the rendered prompt and the opener as completion: the declaration is wrong.
    rows, prompts = prefilled_rows(qwen3_tok)
    for r in rows:
        r["billed_prompt_tokens"] -= 1
        r["billed_completion_tokens"] += 1
    code, failed, _, _ = run(tmp_path, qwen3_tok, rows, prompts, declared(prefiller="<think>"))
    assert code == 1
    assert {"kept_prompt_residual", "kept_billing_residual"} <= failed
    # ... and the same rows pass once the declaration is dropped.
    assert run(tmp_path, qwen3_tok, rows, prompts, declared())[:2] == (0, set())


def test_a_row_whose_completion_does_not_start_with_the_prefill_is_quarantined_with_a_reason(tmp_path, qwen3_tok):
    # Thinking off: the prompt already closed an empty think block, the completion is the answer.
    rows, prompts = prefilled_rows(qwen3_tok)
    rows = [dict(r, reasoning=None) for r in rows]
    _, _, table, result = run(tmp_path, qwen3_tok, rows, prompts, declared(prefiller="<think>"), thinking=False)
    assert set(table.column("quarantine_reason").to_pylist()) == {"prefill_absent"}
    assert "reconstruct.billing.prefill declares" in result.examples["prefill_absent"][0]


def test_the_rule_is_off_by_default(qwen3_tok):
    assert BillingParams().prefill == {} and Setup(qwen3_tok, get_template("qwen3"), {}, True).prefill == {}


def stage_params(tmp_path, qwen3_tok, prefill):
    import yaml

    from test_stage_reconstruct import write_inputs

    args = write_inputs(tmp_path, qwen3_tok)
    p = tmp_path / "params.yaml"
    params = yaml.safe_load(p.read_text())
    params["reconstruct"]["billing"] = {"prefill": prefill}
    p.write_text(yaml.safe_dump(params))
    return args


def test_the_stage_reads_the_prefill_from_params_and_moves_it_into_the_prompt(tmp_path, qwen3_tok):
    import pyarrow.parquet as pq

    from stages import reconstruct as stage

    assert stage.main(stage_params(tmp_path, qwen3_tok, {"LOCAL": "<think>"})) == 0
    rows = {r["prompt_id"]: r for r in pq.read_table(tmp_path / "tokens" / "tokens.parquet").to_pylist()}
    # p1 has no truth ids: its completion is the rendered text without the opener, now the prompt's.
    assert rows["p1"]["completion_ids"] == qwen3_tok.encode("\nHm.\n</think>\n\nAnswer.<|im_end|>")
    assert rows["p1"]["input_ids"][rows["p1"]["prompt_len"] - 1] == qwen3_tok.token_id("<think>")
