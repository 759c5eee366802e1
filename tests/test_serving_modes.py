"""Serving modes per prompt, and the composition gate that recomputes them from the prompt ids.

The Qwen3 hybrid template with the real Qwen3 tokenizer: thinking on leaves the generation prompt
open (the model writes <think>), thinking off closes an empty think block in the prompt. The gate
(expectations/composition.json through stages/gate_composition.py) must tell them apart from the
ids alone and hold each served mode (params.yaml serving.modes) to its share.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from draftgate.checks.serving import common_run
from draftgate.config import PromptsParams
from draftgate.contract import vocab_table
from draftgate.templates.roles import template_roles
from draftgate.reconstruct.core import Setup
from draftgate.templates import encode_segments, get_template
from prompts_fixtures import ingest
from reconstruct_fixtures import reconstruct_tables
from test_prompts import line
from test_reconstruct_gate import names, resp, tables

WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
# Thinking rows carry their reasoning: in the mixed set below no_think holds 24% of the tokens.
BOTH_WAYS = [{"thinking": True, "min_token_share": 0.2}, {"thinking": False, "min_token_share": 0.2}]


def training_set(tok, modes, tools=None):
    """Qwen3 rows reconstructed as the stage does, one prompt per entry of `modes` (thinking on/off),
    each rendered and answered in its own mode."""
    ids, t = names(tok, "qwen3"), get_template("qwen3")
    rows, prompts = [], []
    for k, thinking in enumerate(modes):
        messages = [{"role": "user", "content": f"Say hello ({k})."}]
        prompts.append({"prompt_id": f"p{k}", "dataset": "chat", "split": "train", "thinking": thinking,
                        "tools": json.dumps(tools) if tools else None, "messages": json.dumps(messages)})
        text = f"Hello number {k}!"
        reasoning = "The user greets me; greet back." if thinking else None
        truth = tok.encode((f"<think>\n{reasoning}\n</think>\n\n" if thinking else "") + text + "<|im_end|>")
        served = encode_segments(tok, [t.render_prompt(messages, tools, thinking)], ids)[0]
        rows.append({**resp(f"p{k}", text, truth, len(truth), served), "reasoning": reasoning})
    responses, prompts_t = tables(rows, prompts)
    # The default (template.thinking) is off: each row's own mode must win.
    table, _, _ = reconstruct_tables(responses, prompts_t, Setup(tok, t, ids, False))
    assert table.column("quarantine_reason").null_count == len(modes)
    assert table.column("match").to_pylist() == ["exact"] * len(modes)
    return table


_VOCAB: dict = {}


def composition_gate(tmp_path, tok, table, modes):
    """Run the gate stage on `table` with `modes` as the serving profile: (exit code, failed columns, view rows)."""
    import pyarrow.parquet as pq

    from stages import gate_composition

    ids = names(tok, "qwen3")
    pq.write_table(table, tmp_path / "tokens.parquet")
    (tmp_path / "contract.json").write_text(json.dumps({"special_ids": ids,
                                                        "roles": template_roles(get_template("qwen3"), ids)}))
    if "qwen3" not in _VOCAB:
        _VOCAB["qwen3"] = vocab_table(tok)
    pq.write_table(_VOCAB["qwen3"], tmp_path / "vocab.parquet")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "tokenizer": {"kind": "qwen3"}, "template": {"name": "qwen3"}, "serving": {"modes": modes}}))
    code = gate_composition.main([
        "expectations/composition.json", f"tokens={tmp_path / 'tokens.parquet'}",
        "--input", f"contract={tmp_path / 'contract.json'}", "--input", f"vocab={tmp_path / 'vocab.parquet'}",
        "--result", str(tmp_path / "r.json"), "--params", str(tmp_path / "params.yaml"), "--no-docs"])
    result = json.loads((tmp_path / "r.json").read_text())
    failed = {e["kwargs"].get("column") or e["kwargs"].get("column_A") for e in result["expectations"]
              if not e["success"]}
    return code, failed, result


def test_a_thinking_only_training_set_fails_a_profile_that_serves_thinking_off(tmp_path, qwen3_tok):
    table = training_set(qwen3_tok, [True, True, True])
    assert set(table.column("mode").to_pylist()) == {"think"}
    code, failed, _ = composition_gate(tmp_path, qwen3_tok, table, BOTH_WAYS)
    assert code == 1 and failed == {"token_share"}
    # Served with thinking only, the same set passes.
    code, failed, _ = composition_gate(tmp_path, qwen3_tok, table, [{"thinking": True, "min_token_share": 0.9}])
    assert (code, failed) == (0, set())


def test_a_mixed_training_set_passes_a_profile_that_serves_both(tmp_path, qwen3_tok):
    code, failed, result = composition_gate(tmp_path, qwen3_tok, training_set(qwen3_tok, [True, False, True, False]),
                                            BOTH_WAYS)
    assert (code, failed) == (0, set())
    assert result["computed"]["report"]["served_modes"] == ["think", "no_think"]


def test_the_gate_reads_the_mode_from_the_ids_not_from_the_mode_column(tmp_path, qwen3_tok):
    # The stage's columns rewritten to claim a mixed set: the ids still say thinking only.
    table = training_set(qwen3_tok, [True, True, True, True])
    lie = pa.array(["think", "no_think", "think", "no_think"])
    table = table.set_column(table.schema.get_field_index("mode"), "mode", lie)
    table = table.set_column(table.schema.get_field_index("thinking"), "thinking", pc.equal(lie, "think"))
    code, failed, _ = composition_gate(tmp_path, qwen3_tok, table, BOTH_WAYS)
    assert code == 1 and failed == {"token_share", "label_disagrees"}


def test_a_closed_empty_think_block_in_the_prompt_is_thinking_off_and_a_tool_declaration_is_found(tmp_path, qwen3_tok):
    # Tools declared: the rows are think+tools / no_think+tools, and a profile serving tools without
    # thinking needs the no_think+tools rows.
    table = training_set(qwen3_tok, [True, False], tools=WEATHER)
    assert sorted(table.column("mode").to_pylist()) == ["no_think+tools", "think+tools"]
    code, failed, _ = composition_gate(tmp_path, qwen3_tok, table, [
        {"thinking": False, "tools": True, "min_token_share": 0.2}, {"thinking": True, "tools": True}])
    assert (code, failed) == (0, set())
    # The same conversations without tools: no row is +tools, so that served mode has nothing.
    code, failed, _ = composition_gate(tmp_path, qwen3_tok, training_set(qwen3_tok, [True, False]), [
        {"thinking": False, "tools": True, "min_token_share": 0.2, "min_row_share": 0.2}])
    assert code == 1 and failed == {"token_share", "row_share"}


def test_the_declaration_run_is_the_longest_shared_by_every_holder_and_no_other():
    assert common_run([[9, 1, 2, 3, 4], [1, 2, 3, 4, 8], [7, 1, 2, 3, 4]], [[2, 3, 4, 5]], 2) == [1, 2, 3, 4]
    assert common_run([[1, 2, 3], [1, 2, 3]], [[0, 1, 2, 3]], 2) is None


def test_a_dataset_served_both_ways_gives_each_record_twice_on_one_side_of_the_split():
    records = [line({"messages": [{"role": "user", "content": f"Question {i}?"}]}, "chat.jsonl", i)
               for i in range(1, 21)]
    records.append(line({"messages": [{"role": "user", "content": "Only off."}], "thinking": False}, "chat.jsonl", 21))
    out = ingest(records, PromptsParams(thinking={"chat": "both"}, heldout_fraction=0.3))
    rows = out.prompts.to_pylist()
    assert len(rows) == 41 and out.tally.rows_in == 21
    by_text: dict = {}
    for r in rows:
        by_text.setdefault(r["messages"], []).append(r)
    assert {len(v) for k, v in by_text.items() if "Only off" not in k} == {2}
    for pair in (v for k, v in by_text.items() if "Only off" not in k):
        assert {r["thinking"] for r in pair} == {True, False}
        assert len({r["prompt_id"] for r in pair}) == 2 and len({r["split"] for r in pair}) == 1
    assert [r["thinking"] for r in by_text[next(k for k in by_text if "Only off" in k)]] == [False]
    assert {"heldout", "train"} == {r["split"] for r in rows}
    assert out.tally.by_mode == {"think": 20, "no_think": 21}


def test_kimi_k25_modes_are_read_from_the_prompt_ids_by_the_eval_gates_rule(kimi_standin_tok, monkeypatch):
    # K2.5 prefills <think> (on) or closes <think></think> (off) in the generation prompt, and declares
    # tools as TypeScript text with no special id of its own: the signature is found by rendering.
    from draftgate.checks import serving
    from draftgate.config import parse_params

    tok, t = kimi_standin_tok, get_template("kimi_k25")
    monkeypatch.setattr(serving, "_tokenizer", lambda *a: tok)
    ids = names(tok, "kimi_k25")
    signature = serving.tool_signature(parse_params({"template": {"name": "kimi_k25", "thinking": True}}), ids)
    think = (ids["<think>"], ids["</think>"])
    blank = lambda i: tok.token_bytes(i).strip() == b"" and tok.token_bytes(i) != b""   # noqa: E731
    messages = [{"role": "user", "content": "Weather in Oslo?"}]

    def mode(tools, thinking):
        prompt = encode_segments(tok, [t.render_prompt(messages, tools, thinking)], ids)[0]
        return serving.prompt_mode(prompt, think, blank, signature)

    assert [mode(WEATHER, True), mode(WEATHER, False), mode(None, True), mode(None, False)] == [
        "think+tools", "no_think+tools", "think", "no_think"]


def test_each_request_carries_its_prompts_thinking_switch_at_the_configured_field():
    from draftgate.client.request import Prompt, build_body, request_hash
    from draftgate.config import GenerateParams

    shared = {"chat_template_kwargs": {"add_generation_prompt": True}}
    p = GenerateParams(backend="openai", thinking_field="chat_template_kwargs.enable_thinking", extra_body=shared)
    on, off = (Prompt("p", "chat", [{"role": "user", "content": "Hi"}], None, 2, t) for t in (True, False))
    assert build_body(on, p)["chat_template_kwargs"] == {"add_generation_prompt": True, "enable_thinking": True}
    assert build_body(off, p)["chat_template_kwargs"]["enable_thinking"] is False
    assert shared == {"chat_template_kwargs": {"add_generation_prompt": True}}      # never written into
    assert request_hash(build_body(on, p), "openai") != request_hash(build_body(off, p), "openai")
    # Not configured (the demo): the body, and so the request hash, is what it always was.
    plain = GenerateParams()
    assert build_body(on, plain) == build_body(Prompt("p", "chat", on.messages, None, 2), plain)
