"""`content: None` the way the engines render it (and the bills count it), at every step.

vLLM and SGLang hand a template "" for a content that is None or missing (docs/templates.md has
the lines); transformers' apply_chat_template (5.24) drops the None-valued key instead, and a
template that reads `message.content` (Qwen3's `'</think>' in content`, SmolLM2's concatenation)
raises on the undefined value. The official render (official.py) does what the engines
do, so the contract compares such conversations instead of calling them refused.
"""

from __future__ import annotations

import json

import pytest

from draftgate.contract import check_template
from draftgate.official import OfficialTemplate, OfficialTemplateError, engine_messages, official_template
from draftgate.prompts import RawRecord, Reject, process
from draftgate.reconstruct.core import Setup, reconstruct
from draftgate.templates import get_template
from draftgate.templates.base import render_text
from draftgate.templates.probes import ProbeConversation

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
TOOL_LOOP = [{"role": "user", "content": "Add 2 and 3."},
             {"role": "assistant", "content": None, "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "c1", "content": "5"}]

# Written for this test in the shape of Qwen3-0.6B's official template for the turns above (user,
# an assistant turn with tool calls, tool results, the generation prompt): the assistant branch reads
# `message.content` and tests `'</think>' in content` as the official file does. Not a copy of it.
QWEN3_SHAPE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- set tool_call = tool_call.function %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' + tool_call.arguments + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")


def test_engines_hand_the_template_empty_text_for_a_none_or_missing_content_in_every_role():
    msgs = [{"role": "system"}, {"role": "user", "content": None}, {"role": "assistant", "content": None,
                                                                   "tool_calls": [CALL], "reasoning_content": None}]
    assert engine_messages(msgs) == [{"role": "system", "content": ""}, {"role": "user", "content": ""},
                                     {"role": "assistant", "content": "", "tool_calls": [CALL], "reasoning_content": None}]
    # Only content: a None reasoning_content is the template's to read (Kimi prints it as "None").
    plain = [{"role": "user", "content": "hi"}]
    assert engine_messages(plain) is plain and msgs[1]["content"] is None   # nothing copied, nothing mutated


def test_a_qwen3_shaped_template_raises_on_none_raw_and_renders_it_as_the_code_template_does(qwen3_tok):
    with pytest.raises(Exception, match="no attribute 'content'"):   # transformers alone: the key dropped
        qwen3_tok.hf.apply_chat_template(TOOL_LOOP, chat_template=QWEN3_SHAPE, add_generation_prompt=True,
                                         tokenize=False, enable_thinking=False)
    official = OfficialTemplate("test: Qwen3-shaped", "-", None, qwen3_tok.hf, QWEN3_SHAPE)
    qwen3 = get_template("qwen3")
    text = official.render(TOOL_LOOP, None, qwen3.jinja_kwargs(False))
    assert text == render_text(qwen3.render_prompt(TOOL_LOOP, None, False))
    assert "<|im_start|>assistant\n<tool_call>\n" in text          # empty content: no newline before the call
    # The contract compares it (it used to call it official_refuses and fail the gate as code_invents).
    result = check_template(qwen3, official, (ProbeConversation("none_content", TOOL_LOOP, None, False),))
    assert [p.status for p in result.probes] == ["compared"] and result.ok


def test_the_ggufs_own_template_renders_a_none_content_as_the_engines_do(smollm2_tok):
    official = official_template(smollm2_tok, "smollm2")
    none = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}, {"role": "user", "content": "?"}]
    with pytest.raises(Exception, match="no attribute 'content'"):   # the real SmolLM2 file reads it too
        smollm2_tok.hf.apply_chat_template(none, chat_template=official.template, add_generation_prompt=True,
                                           tokenize=False)
    empty = [dict(m, content=m["content"] or "") for m in none]
    assert official.render(none, None, {}) == official.render(empty, None, {})
    # chatml still refuses it: a prompt it cannot render is rejected before anything is paid for.
    result = check_template(get_template("chatml"), official, (ProbeConversation("none", none, None, False),))
    assert result.probes[0].status == "code_refuses" and result.probes[0].official_text is not None and result.ok


def test_a_template_error_still_names_the_official_source():
    class Broken:
        def apply_chat_template(self, *a, **k):
            raise ValueError("boom")
    with pytest.raises(OfficialTemplateError, match="official template \\(x\\) cannot render"):
        OfficialTemplate("x", "-", None, Broken()).render(TOOL_LOOP, None, {})


@pytest.mark.parametrize("msgs, kept", [
    (TOOL_LOOP, True),                                                       # calls only: null and "" alike
    ([{"role": "user", "content": None}], False),                            # no text, nothing to answer
    ([{"role": "user", "content": "hi"}, {"role": "assistant"}, {"role": "user", "content": "?"}], False),
])
def test_the_prompts_stage_keeps_none_only_beside_tool_calls_and_rejects_the_rest_with_a_reason(msgs, kept):
    out = process(RawRecord("set.jsonl", 1, json.dumps({"messages": msgs}).encode()))
    if kept:
        assert not isinstance(out, Reject) and json.loads(out.messages)[1]["content"] is None
    else:
        assert isinstance(out, Reject) and out.reason == "empty_content" and "messages[" in out.detail


def test_an_answer_with_null_content_beside_reasoning_and_tool_calls_reconstructs_with_empty_content(qwen3_tok):
    # OpenRouter's shape for a thinking model that went straight to a tool call: content null.
    qwen3 = get_template("qwen3")
    golden = qwen3_tok.encode('<think>\nNeed add.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": '
                              '{"a": 2, "b": 3}}\n</tool_call><|im_end|>')
    row = {"prompt_id": "p1", "dataset": "d", "status": "ok", "failure_reason": None, "finish_reason": "tool_calls",
           "reasoning": "Need add.", "reasoning_details": None, "content": None, "provider": "p",
           "tool_calls": json.dumps([CALL]), "billed_completion_tokens": len(golden), "logprobs": None,
           "truth_ids": None}
    prompts = {"p1": {"prompt_id": "p1", "dataset": "d", "split": "train", "tools": None,
                      "messages": json.dumps(TOOL_LOOP[:1])}}
    setup = Setup(qwen3_tok, qwen3, {n: qwen3_tok.token_id(n) for n in qwen3.special_names}, True)
    out = reconstruct([row], prompts, setup).rows[0]
    assert out["quarantine_reason"] is None and out["completion_ids"] == golden
