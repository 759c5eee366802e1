"""Degenerate completions: seq-rep-4 on ids, the `degenerate` quarantine, and the tokens gate's own
recount of it, of the length-truncated rate per dataset and of empty reasoning blocks trained on
(expectations/tokens.json)."""

from __future__ import annotations

import json

from draftgate.reconstruct.core import Setup
from draftgate.reconstruct.degenerate import repetition, tenth
from draftgate.templates import encode_segments, get_template
from reconstruct_fixtures import reconstruct_tables
from test_reconstruct_gate import gate, names, prompt, resp, run_gate, served_prompt, tables

LOOP = "I am a bot. " * 12
PLAIN = ("Paris is the capital of France. It sits on the Seine, and about two million people "
         "live in the city itself.")


def test_a_loop_scores_near_one_and_ordinary_text_near_zero(qwen3_tok):
    loop, plain = qwen3_tok.encode(LOOP), qwen3_tok.encode(PLAIN)
    assert repetition(loop) > 0.8 and repetition(plain) == 0.0
    # One loop from the start: 1 - period / n-grams (the period is one sentence's ids).
    period = len(set(zip(loop, loop[1:], loop[2:], loop[3:])))
    assert repetition(loop) == 1 - period / (len(loop) - 3)
    assert repetition(loop[:4]) == 0.0 and tenth(repetition(loop)) in {"0.8", "0.9"} and tenth(1.0) == "0.9"


def rows_for(tok, texts, finish="stop"):
    rows, prompts = [], []
    for k, text in enumerate(texts):
        truth = tok.encode(text + ("<|im_end|>" if finish == "stop" else ""))
        r = resp(f"p{k}", text, truth, len(truth), served_prompt(tok, "qwen3", f"p{k}"))
        rows.append({**r, "finish_reason": finish})
        prompts.append(prompt(f"p{k}"))
    return rows, prompts


def test_a_looping_completion_is_quarantined_as_degenerate_above_the_threshold(qwen3_tok):
    rows, prompts = rows_for(qwen3_tok, [PLAIN, LOOP, "Hello!"])
    setup = Setup(qwen3_tok, get_template("qwen3"), names(qwen3_tok, "qwen3"), False, max_repetition=0.7)
    table, result, _ = reconstruct_tables(*tables(rows, prompts), setup)
    assert table.column("quarantine_reason").to_pylist() == [None, "degenerate", None]
    assert result.counts["quarantine"]["degenerate"] == 1
    assert "seq-rep-4" in result.examples["degenerate"][0]
    assert sum(result.counts["repetition"].values()) == 3 and result.counts["repetition"]["0.0"] == 2


def test_the_tokens_gate_recounts_repetition_from_the_ids_and_fails_a_kept_loop(tmp_path, qwen3_tok):
    rows, prompts = rows_for(qwen3_tok, [PLAIN, LOOP, "Hello!"])
    ids = names(qwen3_tok, "qwen3")
    # run_gate's reconstruct keeps every row (max_repetition 1.0): the loop reaches the gate.
    code, failed, table = run_gate(tmp_path, qwen3_tok, "qwen3", ids, rows, prompts, max_repetition=0.7)
    assert table.column("quarantine_reason").null_count == 3
    assert code == 1 and failed == {"kept_repetition"}
    # The same loop, quarantined by the stage: the gate has no kept loop to see.
    def quarantine_loop(t):
        import pyarrow as pa

        reasons = pa.array([None, "degenerate", None], pa.string())
        return t.set_column(t.schema.get_field_index("quarantine_reason"), "quarantine_reason", reasons)
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", ids, rows, prompts, corrupt=quarantine_loop,
                               max_repetition=0.7, max_quarantine_rate=0.5)
    assert (code, failed) == (0, set())


def test_the_tokens_gate_fails_a_dataset_mostly_cut_at_max_tokens(tmp_path, qwen3_tok):
    cut, _ = rows_for(qwen3_tok, [PLAIN, "Hello there, how"], finish="length")
    done, _ = rows_for(qwen3_tok, ["Hello!", "Hi.", "Yes.", "No."])
    rows = [{**r, "prompt_id": f"c{k}", "dataset": "code"} for k, r in enumerate(cut)] + done
    prompts = [{**prompt(f"c{k}"), "dataset": "code"} for k in range(2)] + [prompt(f"p{k}") for k in range(4)]
    for r in rows[:2]:
        r["prompt_token_ids"] = None          # served ids are per prompt text; these prompts differ
    ids = names(qwen3_tok, "qwen3")
    # code: 2 of 2 cut; chat: 0 of 4. Pooled, a third: only the per-dataset rate sees it.
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", ids, rows, prompts, max_dataset_length_rate=0.5)
    assert code == 1 and failed == {"dataset_length_rate"}
    code, failed, _ = run_gate(tmp_path, qwen3_tok, "qwen3", ids, rows, prompts, max_dataset_length_rate=1.0)
    assert (code, failed) == (0, set())


def test_the_tokens_gate_fails_empty_reasoning_blocks_trained_on_unless_allowed(tmp_path, qwen3_tok):
    # Qwen3 thinking on: the model wrote <think>\n\n</think> into its completion (it chose not to
    # think); the drafter would learn to skip thinking. A real reasoning block is fine.
    rows, prompts, ids = [], [], names(qwen3_tok, "qwen3")
    for k, (reasoning, text) in enumerate([("", "Hello!"), ("Think.", "Hi."), ("Greet back.", "Hello there.")]):
        truth = qwen3_tok.encode(f"<think>\n{reasoning}\n</think>\n\n{text}<|im_end|>")   # "" -> <think>\n\n</think>
        prompts.append(prompt(f"p{k}"))
        served = encode_segments(qwen3_tok, [get_template("qwen3").render_prompt(
            json.loads(prompts[-1]["messages"]), None, True)], ids)[0]
        rows.append({**resp(f"p{k}", text, truth, len(truth), served), "reasoning": reasoning})
    responses, prompts_t = tables(rows, prompts)
    table, _, _ = reconstruct_tables(responses, prompts_t, Setup(qwen3_tok, get_template("qwen3"), ids, True))
    assert table.column("quarantine_reason").null_count == 3 and table.column("match").to_pylist() == ["exact"] * 3
    code, failed = gate(tmp_path, qwen3_tok, table, responses, "qwen3", ids, prompts_t)
    assert code == 1 and failed == {"empty_reasoning_rate"}
    code, failed = gate(tmp_path, qwen3_tok, table, responses, "qwen3", ids, prompts_t, max_empty_reasoning_rate=0.5)
    assert (code, failed) == (0, set())
