"""Reconstruction end to end on rows built from small dicts, with the real tokenizers.

Goldens are written as the model's own text (docs/templates.md formats) and encoded by the tokenizer's
full-string encode with special tokens parsed: an independent path from the structural one
under test. Truth ids are those goldens unless a test says otherwise.
"""

from __future__ import annotations

import json

import pytest

from draftgate.reconstruct.core import ReconstructError, Setup, reconstruct
from draftgate.reconstruct.logprobs import BytesIndex
from draftgate.templates import get_template

ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
ODD_ARGS = '{"a":2,  "b" : 3}'   # spacing that a re-serialiser would destroy


# ---------------------------------------------------------------- helpers

def setup_for(tok, name, thinking, method="auto", ids=None):
    t = get_template(name)
    return Setup(tok, t, ids or {n: tok.token_id(n) for n in t.special_names}, thinking, method)


def prompt(pid="p1", content="Add 2 and 3.", tools=None, dataset="d"):
    return {pid: {"prompt_id": pid, "dataset": dataset, "split": "train",
                  "messages": json.dumps([{"role": "user", "content": content}]),
                  "tools": json.dumps(tools) if tools else None}}


def response(pid="p1", content="", reasoning=None, tool_calls=None, finish="stop", truth=None,
             billed=None, **kw):
    return {"prompt_id": pid, "dataset": "d", "status": "ok", "failure_reason": None,
            "finish_reason": finish, "reasoning": reasoning, "reasoning_details": None,
            "content": content, "provider": "local",
            "tool_calls": json.dumps(tool_calls) if tool_calls is not None else None,
            "billed_completion_tokens": billed, "logprobs": None, "truth_ids": truth, **kw}


def call(name, args, cid):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def one(tok, setup, resp, prompts=None):
    res = reconstruct([resp], prompts or prompt(tools=[ADD_TOOL]), setup)
    return res.rows[0], res


# ---------------------------------------------------------------- goldens per template

QWEN3_COMPLETION = ('<think>\nThe user wants a sum.\n</think>\n\nCalling add.\n<tool_call>\n'
                    '{"name": "add", "arguments": ' + ODD_ARGS + '}\n</tool_call><|im_end|>')


def test_qwen3_reasoning_content_and_tool_call_reconstruct_exactly_with_arguments_verbatim(qwen3_tok):
    truth = qwen3_tok.encode(QWEN3_COMPLETION)
    row, res = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", True),
                   response(content="Calling add.", reasoning="The user wants a sum.",
                            tool_calls=[call("add", ODD_ARGS, "call_9")], finish="tool_calls",
                            truth=truth, billed=len(truth)))
    assert (row["method"], row["match"], row["quarantine_reason"]) == ("truth", "exact", None)
    assert row["completion_ids"] == truth
    assert qwen3_tok.decode(row["completion_ids"]) == QWEN3_COMPLETION
    assert row["input_ids"][row["prompt_len"]:] == truth
    assert row["loss_mask"] == [0] * row["prompt_len"] + [1] * len(truth)
    assert (row["ends_with_eos"], row["think_balanced"], row["tool_markers_balanced"],
            row["special_in_text"]) == (True, True, True, False)
    assert row["billing_delta"] == 0


def test_qwen3_prompt_ids_are_what_the_serving_engine_encodes_from_the_rendered_prompt(qwen3_tok):
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", True), response(content="5"))
    prompt_text = qwen3_tok.decode(row["input_ids"][:row["prompt_len"]])
    assert prompt_text.startswith("<|im_start|>system\n# Tools\n")
    assert prompt_text.endswith("<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n")
    assert qwen3_tok.encode(prompt_text) == row["input_ids"][:row["prompt_len"]]


def test_kimi_prefilled_think_tool_call_with_stripped_id_reconstructs_exactly(kimi_standin_tok):
    tok = kimi_standin_tok
    golden = ("Need add.</think>Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0"
              "<|tool_call_argument_begin|>" + ODD_ARGS + "<|tool_call_end|><|tool_calls_section_end|><|im_end|>")
    truth = tok.encode(golden)
    row, res = one(tok, setup_for(tok, "kimi_k25", True),
                   response(content="Sure.", reasoning="Need add.", finish="tool_calls",
                            tool_calls=[call("add", ODD_ARGS, "add:0")], truth=truth))
    assert (row["match"], row["quarantine_reason"]) == ("exact", None)
    assert json.loads(row["normalisations"]) == ["tool_id_restored"]
    # The prompt ends with the prefilled <think>: the completion starts inside the block.
    assert tok.decode(row["input_ids"][:row["prompt_len"]]).endswith("<|im_assistant|>assistant<|im_middle|><think>")
    assert row["think_balanced"] is True


def test_kimi_reasoning_straight_into_tool_calls_is_rendered_without_think_end_when_truth_shows_it(kimi_standin_tok):
    tok = kimi_standin_tok
    golden = ("Need add.<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0"
              "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>")
    truth = tok.encode(golden)
    row, _ = one(tok, setup_for(tok, "kimi_k25", True),
                 response(content=None, reasoning="Need add.", finish="tool_calls",
                          tool_calls=[call("add", "{}", "functions.add:0")], truth=truth))
    assert (row["match"], row["quarantine_reason"], row["think_balanced"]) == ("exact", None, True)
    assert "kimi_think_unclosed" in json.loads(row["normalisations"])


def test_chatml_smollm2_content_only_reconstructs_exactly(smollm2_tok):
    truth = smollm2_tok.encode("The capital of France is Paris.<|im_end|>")
    row, _ = one(smollm2_tok, setup_for(smollm2_tok, "chatml", False),
                 response(content="The capital of France is Paris.", truth=truth), prompt())
    assert (row["method"], row["match"], row["quarantine_reason"]) == ("truth", "exact", None)
    assert smollm2_tok.decode(row["input_ids"]).startswith("<|im_start|>system\nYou are a helpful AI")


# ---------------------------------------------------------------- classification

def test_a_non_canonical_split_of_the_same_text_is_bpe_only_with_first_diff_and_context(qwen3_tok):
    # docs/tokenizers.md: sampling produced " Pantom" as [53122, 316]; re-encoding gives [393, 30002].
    assert qwen3_tok.encode_ordinary(" Pantom") == [393, 30002]
    truth = qwen3_tok.encode("Hi") + [53122, 316] + qwen3_tok.encode("<|im_end|>")
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False),
                 response(content="Hi Pantom", truth=truth), prompt())
    assert row["match"] == "bpe_only"
    assert row["completion_ids"] == truth          # the real ids win
    assert row["first_diff"] == 1
    ctx = json.loads(row["diff_context"])
    assert ctx["truth"]["ids"][1:3] == [53122, 316] and ctx["text_method"]["ids"][1:3] == [393, 30002]
    assert ctx["truth"]["text"] == ctx["text_method"]["text"] == "Hi Pantom<|im_end|>"


def test_a_provider_that_trimmed_whitespace_makes_the_row_semantic(qwen3_tok):
    truth = qwen3_tok.encode("Answer: 5\n\n<|im_end|>")
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False),
                 response(content="Answer: 5", truth=truth), prompt())
    assert row["match"] == "semantic"
    assert row["method"] == "truth" and row["completion_ids"] == truth


def test_method_text_forces_reencoding_but_still_classifies_against_truth(qwen3_tok):
    truth = qwen3_tok.encode("Hi") + [53122, 316] + qwen3_tok.encode("<|im_end|>")
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False, method="text"),
                 response(content="Hi Pantom", truth=truth), prompt())
    assert (row["method"], row["match"]) == ("text", "bpe_only")
    assert row["completion_ids"] == qwen3_tok.encode("Hi Pantom<|im_end|>")


def test_without_truth_the_match_is_unknown(qwen3_tok):
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False), response(content="Hi"), prompt())
    assert (row["method"], row["match"], row["first_diff"]) == ("text", "unknown", None)


# ---------------------------------------------------------------- logprobs

def logprobs_of(tok, ids):
    return json.dumps({"content": [{"token": tok.token_bytes(i).decode("utf-8", "replace"),
                                    "logprob": -0.1, "bytes": list(tok.token_bytes(i)),
                                    "top_logprobs": []} for i in ids]})


def test_logprob_bytes_recover_a_non_canonical_split_including_a_character_split_across_tokens(qwen3_tok):
    # "é" as two single-byte tokens: each entry's `token` is a replacement character; only its
    # bytes say what it was. Without truth, these ids are the model's.
    e1, e2 = qwen3_tok.token_id("Ã"), qwen3_tok.token_id("©")
    assert qwen3_tok.token_bytes(e1) + qwen3_tok.token_bytes(e2) == "é".encode()
    ids = qwen3_tok.encode("caf") + [e1, e2] + [53122, 316]
    setup = setup_for(qwen3_tok, "qwen3", False)
    index = BytesIndex(qwen3_tok.token_bytes, qwen3_tok.vocab_size)
    res = reconstruct([response(content="café Pantom", logprobs=logprobs_of(qwen3_tok, ids))],
                      prompt(), setup, index)
    row = res.rows[0]
    # The end token has no logprob entry here: appended, since the text says the turn ended.
    assert row["method"] == "logprobs"
    assert row["completion_ids"] == ids + [qwen3_tok.token_id("<|im_end|>")]
    assert row["match"] == "bpe_only"


def test_logprobs_covering_only_the_content_fall_back_to_text_with_the_reason_counted(qwen3_tok):
    setup = setup_for(qwen3_tok, "qwen3", True)
    index = BytesIndex(qwen3_tok.token_bytes, qwen3_tok.vocab_size)
    resp = response(content="5", reasoning="Sum.", logprobs=logprobs_of(qwen3_tok, qwen3_tok.encode("5")))
    res = reconstruct([resp], prompt(), setup, index)
    assert res.rows[0]["method"] == "text"
    assert res.counts["logprobs_fallback"] == {"logprobs_incomplete": 1}


# ---------------------------------------------------------------- edge cases

def test_literal_special_token_text_in_content_stays_text(qwen3_tok):
    content = "Models end turns with <|im_end|> and think in <think> tags."
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False), response(content=content), prompt())
    ids = row["completion_ids"]
    im_end = qwen3_tok.token_id("<|im_end|>")
    assert ids.count(im_end) == 1 and ids[-1] == im_end
    assert qwen3_tok.token_id("<think>") not in ids
    assert qwen3_tok.decode(ids) == content + "<|im_end|>"
    assert (row["special_in_text"], row["quarantine_reason"]) == (False, None)


def test_empty_reasoning_renders_an_empty_think_block(qwen3_tok):
    truth = qwen3_tok.encode("<think>\n\n</think>\n\n5<|im_end|>")
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", True),
                 response(content="5", reasoning="", truth=truth), prompt())
    assert (row["match"], row["quarantine_reason"]) == ("exact", None)


def test_tool_calls_only_with_null_content(qwen3_tok):
    golden = ('<think>\nx\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>\n'
              '<tool_call>\n{"name": "add", "arguments": ' + ODD_ARGS + '}\n</tool_call><|im_end|>')
    truth = qwen3_tok.encode(golden)
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", True),
                 response(content=None, reasoning="x", finish="tool_calls", truth=truth,
                          tool_calls=[call("add", "{}", "a"), call("add", ODD_ARGS, "b")]))
    assert (row["match"], row["quarantine_reason"], row["tool_markers_balanced"]) == ("exact", None, True)


def test_length_truncated_response_has_no_end_token_and_is_kept(qwen3_tok):
    truth = qwen3_tok.encode("<think>\nLet me think about th")
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", True),
                 response(content=None, reasoning="Let me think about th", finish="length", truth=truth),
                 prompt())
    assert (row["match"], row["quarantine_reason"]) == ("exact", None)
    assert (row["ends_with_eos"], row["think_balanced"]) == (False, True)


def test_reasoning_inside_content_is_split_out_and_counted(qwen3_tok):
    truth = qwen3_tok.encode("<think>\nSum.\n</think>\n\n5<|im_end|>")
    row, res = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", True),
                   response(content="<think>\nSum.\n</think>\n\n5", truth=truth), prompt())
    assert row["match"] == "exact"
    assert res.counts["normalisations"] == {"reasoning_from_content": 1}


@pytest.mark.parametrize("details, reason", [
    ([{"type": "reasoning.summary", "summary": "I added."}], "reasoning_summary"),
    ([{"type": "reasoning.encrypted", "data": "gAAAA..."}], "reasoning_encrypted"),
])
def test_summary_or_encrypted_reasoning_is_quarantined(qwen3_tok, details, reason):
    row, res = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", True),
                   response(content="5", reasoning="I added.", reasoning_details=json.dumps(details)),
                   prompt())
    assert row["quarantine_reason"] == reason
    assert row["completion_ids"] is None
    assert res.counts["quarantine"] == {reason: 1}


def test_failed_responses_are_carried_as_quarantine_with_their_reason(qwen3_tok):
    row, res = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False),
                   response(status="failed", failure_reason="http_400", finish=None), prompt())
    assert row["quarantine_reason"] == "response_failed:http_400"
    assert res.examples["response_failed:http_400"] == ["p1: http_400"]


def test_a_response_without_its_prompt_is_quarantined(qwen3_tok):
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False), response(pid="nope"), prompt())
    assert row["quarantine_reason"] == "prompt_missing"


def test_a_completion_the_template_cannot_render_is_quarantined_with_the_reason(qwen3_tok):
    # Reasoning while thinking is off: the prompt already closed an empty think block.
    row, res = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False),
                   response(content="5", reasoning="Sum."), prompt())
    assert row["quarantine_reason"] == "template_error"
    assert "thinking" in res.examples["template_error"][0]


def test_truth_that_stops_without_an_end_token_is_quarantined(qwen3_tok):
    truth = qwen3_tok.encode("Hi")
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False), response(content="Hi", truth=truth), prompt())
    assert row["quarantine_reason"] == "no_end_token"


def test_a_prompt_whose_text_the_engine_would_parse_as_a_special_token_is_prefix_unstable(qwen3_tok):
    # The serving engine tokenizes the rendered string with special tokens parsed: a user who
    # writes "<|im_end|>" changes what the model saw. Our structural prompt ids cannot match.
    row, res = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False), response(content="ok"),
                   prompt(content="Explain <|im_end|> please"))
    assert row["quarantine_reason"] == "prefix_unstable"
    assert "holds '<|im_end|>'" in res.examples["prefix_unstable"][0]


def test_a_completion_that_merges_with_the_end_of_the_prompt_is_prefix_unstable(qwen3_tok):
    # Thinking off: the prompt ends "</think>\n\n"; content starting with newlines merges with it
    # when the whole conversation is encoded as one string.
    assert qwen3_tok.encode("\n\n\nx")[0] != qwen3_tok.encode("\n\n")[0]
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False), response(content="\nx"), prompt())
    assert row["quarantine_reason"] == "prefix_unstable"


@pytest.mark.parametrize("user, content", [
    ("Hi", "x"), ("Hi", "\nx"), ("Hi", "\n\n"), ("Hi", " x"), ("Hi", "\t\n y"), ("Hi", "<|im_end|>"),
    ("Hi", "!!!"), ("Use <think> tags", "ok"), ("Hi", "  \n\n  z"), ("<|endoftext|>", "x"),
])
def test_the_prefix_verdict_equals_encoding_the_whole_conversation_as_one_string(qwen3_tok, user, content):
    # The stage checks a window (prompt tail + completion head) and literal added tokens; the
    # definition is the whole rendered conversation through the engine's encode.
    from draftgate.templates import render_text

    t = get_template("qwen3")
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False), response(content=content), prompt(content=user))
    prompt_ids = row["input_ids"][:row["prompt_len"]]
    messages = [{"role": "user", "content": user}]
    from draftgate.templates import Completion
    full = render_text(t.render_prompt(messages, None, False) + t.render_completion(Completion(None, content), False))
    stable = qwen3_tok.encode(full)[:len(prompt_ids)] == prompt_ids
    assert (row["quarantine_reason"] != "prefix_unstable") is stable


# ---------------------------------------------------------------- the 163533 replay

def test_a_contract_with_im_end_163533_is_caught_on_the_rows(kimi_standin_tok):
    tok = kimi_standin_tok
    t = get_template("kimi_k25")
    ids = {n: tok.token_id(n) for n in t.special_names} | {"<|im_end|>": 163533}
    golden = "Hello there.<|im_end|>"
    row, _ = one(tok, Setup(tok, t, ids, False), response(content="Hello there.", truth=tok.encode(golden)),
                 prompt())
    # The real end token (163586) is in the truth; 163533 is where the text method put it.
    assert row["match"] == "semantic"
    assert row["quarantine_reason"] in ("prefix_unstable", "no_end_token")
    assert tok.encode(golden)[-1] == 163586


def test_missing_special_names_in_the_contract_stop_the_batch(qwen3_tok):
    t = get_template("qwen3")
    ids = {n: qwen3_tok.token_id(n) for n in t.special_names if n != "</think>"}
    with pytest.raises(ReconstructError, match="</think>"):
        reconstruct([response()], prompt(), Setup(qwen3_tok, t, ids, True))


def test_every_text_segment_of_the_batch_is_encoded_in_one_tokenizer_call(qwen3_tok):
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(qwen3_tok, name)

        def encode_ordinary_batch(self, texts):
            calls.append(len(texts))
            return qwen3_tok.encode_ordinary_batch(texts)

    prompts = {**prompt("a"), **prompt("b", content="Other")}
    rows = [response("a", content="x"), response("b", content="y", reasoning="r")]
    res = reconstruct(rows, prompts, setup_for(Counting(), "qwen3", True))
    assert len(calls) == 1 and calls[0] > 4
    assert [r["quarantine_reason"] for r in res.rows] == [None, None]


def test_truth_ids_outside_the_vocabulary_are_quarantined_not_trusted(qwen3_tok):
    truth = qwen3_tok.encode("Hi<|im_end|>") + [qwen3_tok.vocab_size + 5]
    row, _ = one(qwen3_tok, setup_for(qwen3_tok, "qwen3", False), response(content="Hi", truth=truth), prompt())
    assert row["quarantine_reason"] == "truth_ids_outside_vocabulary"


def test_prompt_ids_returned_by_the_backend_must_equal_the_rendered_prompts(qwen3_tok):
    setup = setup_for(qwen3_tok, "qwen3", False)
    good, _ = one(qwen3_tok, setup, response(content="Hi"), prompt())
    served = good["input_ids"][:good["prompt_len"]]
    row, _ = one(qwen3_tok, setup, response(content="Hi", prompt_token_ids=served), prompt())
    assert row["quarantine_reason"] is None
    # A backend that rendered a different prompt (here: without the empty think block).
    row, res = one(qwen3_tok, setup, response(content="Hi", prompt_token_ids=served[:-4]), prompt())
    assert row["quarantine_reason"] == "prompt_ids_differ"
    assert "differ from the rendered prompt's at" in res.examples["prompt_ids_differ"][0]


# ---------------------------------------------------------------- one prompt, many responses

def test_responses_sharing_a_prompt_get_the_rows_they_would_get_one_at_a_time(qwen3_tok, monkeypatch):
    setup = setup_for(qwen3_tok, "qwen3", True)
    prompts = {**prompt("a", tools=[ADD_TOOL]), **prompt("b", content="Use <think> tags")}
    rows = [response("a", content="5", reasoning="sum"), response("b", content="x", reasoning="r"),
            response("a", content="", reasoning="call", tool_calls=[call("add", ODD_ARGS, "c")],
                     finish="tool_calls"),
            response("a", content="6", reasoning="again", truth=[1, 2]), response("zz", content="?")]
    alone = [reconstruct([r], prompts, setup).rows[0] for r in rows]
    rendered = []
    real = setup.template.render_prompt
    monkeypatch.setattr(setup.template, "render_prompt", lambda *a: rendered.append(1) or real(*a))
    together = reconstruct(rows, prompts, setup)
    assert together.rows == alone
    assert len(rendered) == 2           # "a" three times, "b" once, "zz" missing: two renders
    assert [r["quarantine_reason"] for r in alone] == [None, "prefix_unstable", None, "no_end_token",
                                                       "prompt_missing"]


def test_split_rows_carry_the_prompt_ids_that_joined_rows_put_in_front_of_the_completion(qwen3_tok):
    from draftgate.reconstruct.core import PROMPT_IDS

    setup = setup_for(qwen3_tok, "qwen3", True)
    prompts = prompt("a", tools=[ADD_TOOL])
    rows = [response("a", content="5", reasoning="sum"), response("a", content="x", truth=[7, 8])]
    joined = reconstruct(rows, prompts, setup).rows
    split = reconstruct(rows, prompts, setup, joined=False).rows
    for j, s in zip(joined, split):
        assert s[PROMPT_IDS] + s["completion_ids"] == j["input_ids"]
        assert (s["input_ids"], s["loss_mask"]) == (None, None)
        assert {k: v for k, v in s.items() if k not in (PROMPT_IDS, "input_ids", "loss_mask")} == \
            {k: v for k, v in j.items() if k not in ("input_ids", "loss_mask")}
