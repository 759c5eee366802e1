"""Kimi templates, one release at a time: hand-written goldens (checked offline against each
official template rendered by transformers' Jinja), completions, errors that name the fix."""

from __future__ import annotations

import pytest

from draftgate.templates import (
    Completion, KimiK25Template, TemplateError, ToolCall, get_template, kimi_tool_call_id, render_text,
)
from draftgate.templates.kimi_tools_ts import compact_json_declaration
from test_templates import assert_renders

ODD_ARGS = '{"a":1,  "b" : [1,2]}'          # spacing a re-serialiser would destroy
WEATHER_ARGS = '{"city": "Paris"}'
ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}, "required": ["a", "b"]}}}
TWO_CALLS = (ToolCall("add", ODD_ARGS, "add:0"), ToolCall("get_weather", WEATHER_ARGS, None))

U = "<|im_user|>user<|im_middle|>"
A = "<|im_assistant|>assistant<|im_middle|>"
END = "<|im_end|>"
K2_SYSTEM = "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
KIMI_SYSTEM = "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
DECLARE = "<|im_system|>tool_declare<|im_middle|>"
# ADD_TOOL's keys deep-sorted (the tokenizer's hook), as JSON with ", " / ": " (K2, K2-Thinking).
ADD_JSON = ('[{"function": {"description": "Add two integers.", "name": "add", "parameters": {"properties": '
            '{"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "type": "object"}}, '
            '"type": "function"}]')
# The same as K2.5 declares it: TypeScript, required fields sorted.
ADD_TS = ("# Tools\n\n## functions\nnamespace functions {\n// Add two integers.\n"
          "type add = (_: {\n  a: number,\n  b: number\n}) => any;\n}\n")
TWO_KIMI_CALLS = ("<|tool_calls_section_begin|>"
                  '<|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>{"a":1,  "b" : [1,2]}<|tool_call_end|>'
                  "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>"
                  '{"city": "Paris"}<|tool_call_end|>'
                  "<|tool_calls_section_end|>")


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


# A conversation with a finished exchange (reasoning in history) and a live tool loop after it.
HISTORY_THEN_LOOP = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "reasoning_content": "Greet.", "content": "Hello!"},
    {"role": "user", "content": "Weather in Paris and 1+2?"},
    {"role": "assistant", "reasoning_content": "Two tools.", "content": "", "tool_calls": [
        call("functions.get_weather:0", "get_weather", WEATHER_ARGS),
        call("functions.add:1", "add", '{"a": 1, "b": 2}')]},
    {"role": "tool", "name": "get_weather", "tool_call_id": "functions.get_weather:0", "content": "18°C ☀"},
    {"role": "tool", "tool_call_id": "functions.add:1", "content": "3"},
]
HISTORY_THEN_LOOP_BODY = (
    U + "Hi" + END + A + "<think></think>Hello!" + END + U + "Weather in Paris and 1+2?" + END
    + A + "<think>{loop}</think><|tool_calls_section_begin|>"
    '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
    '<|tool_call_begin|>functions.add:1<|tool_call_argument_begin|>{"a": 1, "b": 2}<|tool_call_end|>'
    "<|tool_calls_section_end|>" + END
    + "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n18°C ☀" + END
    + "<|im_system|>tool<|im_middle|>## Return of functions.add:1\n3" + END)


# ---------------------------------------------------------------- every release: common facts

@pytest.mark.parametrize("name, kwargs_on, kwargs_off", [
    ("kimi_k2", None, {}), ("kimi_k2_thinking", {}, None), ("kimi_k25", {"thinking": True}, {"thinking": False}),
])
def test_each_kimi_release_is_of_the_kimi_family_and_names_its_official_template_and_kwargs(name, kwargs_on,
                                                                                           kwargs_off):
    t = get_template(name)
    assert t.family == "kimi" and t.official
    if kwargs_on is not None:
        assert t.jinja_kwargs(True) == kwargs_on
    if kwargs_off is not None:
        assert t.jinja_kwargs(False) == kwargs_off


@pytest.mark.parametrize("raw, idx, expected", [
    ("add:0", 5, "functions.add:0"),                     # OpenRouter stripped "functions."
    ("functions.add:3", 0, "functions.add:3"),
    ("call_9f2c", 2, "functions.add:2"),                 # provider's own id: use the running index
    ("0123456789abcdef0123456789abcdef", 1, "functions.add:1"),
    (None, 0, "functions.add:0"),
    ("sub:0", 4, "functions.add:4"),                     # names another function: not ours
])
def test_kimi_tool_call_id_restores_the_models_own_id(raw, idx, expected):
    assert kimi_tool_call_id(raw, "add", idx) == expected


def test_kimi_tool_call_id_is_still_importable_from_the_kimi_k2_module():
    from draftgate.templates.kimi_k2 import kimi_tool_call_id as from_k2

    assert from_k2 is kimi_tool_call_id


# ---------------------------------------------------------------- kimi_k2: K2-Instruct's early template

def test_k2_adds_its_default_system_turn_and_ends_at_the_assistant_header():
    t = get_template("kimi_k2")
    assert_renders(t.render_prompt([{"role": "user", "content": "2+2?"}], None, False),
                   K2_SYSTEM + U + "2+2?" + END + A, t)


def test_k2_multi_turn_keeps_a_given_system_turn_and_renders_tool_results_bare():
    t = get_template("kimi_k2")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ça va ? 🤖"},
            {"role": "assistant", "content": ""}, {"role": "tool", "name": "x", "tool_call_id": "c", "content": "ok"},
            {"role": "user", "content": ""}]
    assert_renders(t.render_prompt(msgs, None, False),
                   "<|im_system|>system<|im_middle|>Be brief." + END + U + "Ça va ? 🤖" + END + A + END
                   + "<|im_system|>tool<|im_middle|>ok" + END + U + END + A, t)


def test_k2_declares_tools_as_deep_sorted_json_before_the_default_system_turn():
    t = get_template("kimi_k2")
    assert_renders(t.render_prompt([{"role": "user", "content": "add 1 and 2"}], [ADD_TOOL], False),
                   DECLARE + ADD_JSON + END + K2_SYSTEM + U + "add 1 and 2" + END + A, t)


@pytest.mark.parametrize("messages, thinking, match", [
    ([{"role": "user", "content": "x"}], True, "no thinking mode"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        call("functions.add:0", "add", "{}")]}], False, r"messages\[1\] has tool_calls"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "4", "reasoning_content": "r"}], False,
     r"messages\[1\] carries reasoning"),
], ids=["thinking", "history_tool_calls", "history_reasoning"])
def test_k2_refuses_what_its_template_has_no_slot_for(messages, thinking, match):
    with pytest.raises(TemplateError, match=match):
        get_template("kimi_k2").render_prompt(messages, None, thinking)


def test_k2_completion_is_content_then_the_tool_section_with_the_models_ids():
    t = get_template("kimi_k2")
    assert_renders(t.render_completion(Completion(None, "4"), False), "4" + END, t)
    assert_renders(t.render_completion(Completion(None, "Sure.", TWO_CALLS), False), "Sure." + TWO_KIMI_CALLS + END, t)
    assert_renders(t.render_completion(Completion(None, "The ans", truncated=True), False), "The ans", t)
    with pytest.raises(TemplateError, match="does not think"):
        t.render_completion(Completion("thought", "4"), False)


# ---------------------------------------------------------------- kimi_k2_thinking

def test_k2_thinking_prompt_ends_before_think_so_the_completion_opens_it():
    t = get_template("kimi_k2_thinking")
    assert_renders(t.render_prompt([{"role": "user", "content": "2+2?"}], None, True),
                   KIMI_SYSTEM + U + "2+2?" + END + A, t)
    assert_renders(t.render_completion(Completion("Add.", "4"), True), "<think>Add.</think>4" + END, t)
    assert_renders(t.render_completion(Completion("", "4"), True), "<think></think>4" + END, t)


def test_k2_thinking_keeps_reasoning_only_after_the_last_plain_reply_and_writes_names_and_ids():
    t = get_template("kimi_k2_thinking")
    assert_renders(t.render_prompt(HISTORY_THEN_LOOP, None, True),
                   KIMI_SYSTEM + HISTORY_THEN_LOOP_BODY.replace("{loop}", "Two tools.") + A, t)


def test_k2_thinking_declares_deep_sorted_json_and_keeps_a_given_system_turn():
    t = get_template("kimi_k2_thinking")
    msgs = [{"role": "system", "content": "Réponds en français."}, {"role": "user", "content": "add 1 and 2"}]
    assert_renders(t.render_prompt(msgs, [ADD_TOOL], True),
                   DECLARE + ADD_JSON + END + "<|im_system|>system<|im_middle|>Réponds en français." + END
                   + U + "add 1 and 2" + END + A, t)


def test_k2_thinking_completion_reasoning_into_tool_calls_without_think_end_and_truncation():
    t = get_template("kimi_k2_thinking")
    assert_renders(t.render_completion(Completion("Call.", None, TWO_CALLS, think_closed=False), True),
                   "<think>Call." + TWO_KIMI_CALLS + END, t)
    assert_renders(t.render_completion(Completion("Let me th", None, truncated=True), True), "<think>Let me th", t)
    assert_renders(t.render_completion(Completion("R", "part", truncated=True), True), "<think>R</think>part", t)


def test_k2_thinking_has_no_non_thinking_mode():
    t = get_template("kimi_k2_thinking")
    with pytest.raises(TemplateError, match="no non-thinking mode"):
        t.render_prompt([{"role": "user", "content": "x"}], None, False)
    with pytest.raises(TemplateError, match="no non-thinking mode"):
        t.render_completion(Completion(None, "4"), False)


# ---------------------------------------------------------------- kimi_k25

def test_k25_has_no_default_system_turn_and_prefills_think_when_thinking():
    t = get_template("kimi_k25")
    assert_renders(t.render_prompt([{"role": "user", "content": "2+2?"}], None, True),
                   U + "2+2?" + END + A + "<think>", t)
    assert_renders(t.render_completion(Completion("Add.", "4"), True), "Add.</think>4" + END, t)
    assert_renders(t.render_completion(Completion("", "4"), True), "</think>4" + END, t)


def test_k25_thinking_off_prefills_an_empty_think_block_and_refuses_reasoning_after_it():
    t = get_template("kimi_k25")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert_renders(t.render_prompt(msgs, None, False),
                   "<|im_system|>system<|im_middle|>Be brief." + END + U + "2+2?" + END + A + "<think></think>", t)
    assert_renders(t.render_completion(Completion(None, "4"), False), "4" + END, t)
    with pytest.raises(TemplateError, match="thinking is disabled"):
        t.render_completion(Completion("thought", "4"), False)


@pytest.mark.parametrize("thinking, loop_reasoning, gen", [(True, "Two tools.", "<think>"),
                                                          (False, "", "<think></think>")])
def test_k25_history_reasoning_follows_the_thinking_switch(thinking, loop_reasoning, gen):
    t = get_template("kimi_k25")
    assert_renders(t.render_prompt(HISTORY_THEN_LOOP, None, thinking),
                   HISTORY_THEN_LOOP_BODY.replace("{loop}", loop_reasoning) + A + gen, t)


def test_k25_declares_tools_the_typescript_way_by_default():
    t = get_template("kimi_k25")
    assert_renders(t.render_prompt([{"role": "user", "content": "add 1 and 2"}], [ADD_TOOL], True),
                   DECLARE + ADD_TS + END + U + "add 1 and 2" + END + A + "<think>", t)


def test_k25_falls_back_to_compact_json_for_a_schema_the_typescript_encoder_refuses():
    t = get_template("kimi_k25")
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"v": {"oneOf": [{"type": "number"}, {"type": "string"}]}}}}}
    assert_renders(t.render_prompt([{"role": "user", "content": "u"}], [tool], False),
                   DECLARE + '[{"function":{"name":"f","parameters":{"properties":{"v":{"oneOf":[{"type":"number"},'
                   '{"type":"string"}]}},"type":"object"}},"type":"function"}]' + END + U + "u" + END + A
                   + "<think></think>", t)


def test_k25_json_declaration_is_what_the_bare_jinja_renders_without_the_tokenizer_hook():
    t = KimiK25Template(declare_tools=compact_json_declaration)
    segs = t.render_prompt([{"role": "user", "content": "u"}], [ADD_TOOL], True)
    assert render_text(segs).startswith(DECLARE + '[{"function":{"description":"Add two integers.","name":"add",'
                                        '"parameters":{"properties":{"a":{"type":"integer"},"b":{"type":"integer"}},'
                                        '"required":["a","b"],"type":"object"}},"type":"function"}]' + END + U)


def test_k25_completion_reasoning_into_tool_calls_without_think_end():
    t = get_template("kimi_k25")
    assert_renders(t.render_completion(Completion("Call.", None, TWO_CALLS), True),
                   "Call.</think>" + TWO_KIMI_CALLS + END, t)
    assert_renders(t.render_completion(Completion("Call.", None, TWO_CALLS, think_closed=False), True),
                   "Call." + TWO_KIMI_CALLS + END, t)
    with pytest.raises(TemplateError, match="think_closed"):
        t.render_completion(Completion("Call.", "text", think_closed=False), True)
    assert_renders(t.render_completion(Completion("Let me th", None, truncated=True), True), "Let me th", t)


# ---------------------------------------------------------------- errors shared by the think-block releases

@pytest.mark.parametrize("name", ["kimi_k2_thinking", "kimi_k25"])
def test_history_tool_call_without_id_is_an_error_naming_the_message(name):
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "add", "arguments": "{}"}}]}]
    with pytest.raises(TemplateError, match=r"messages\[1\]\.tool_calls\[0\] has no id"):
        get_template(name).render_prompt(msgs, None, True)


@pytest.mark.parametrize("name", ["kimi_k2_thinking", "kimi_k25"])
def test_reasoning_content_none_in_the_tool_loop_is_refused_because_the_template_would_print_none(name):
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "reasoning_content": None,
             "tool_calls": [call("functions.add:0", "add", "{}")]},
            {"role": "tool", "tool_call_id": "functions.add:0", "content": "1"}]
    with pytest.raises(TemplateError, match=r"messages\[1\]\.reasoning_content is None.*'None'"):
        get_template(name).render_prompt(msgs, None, True)
    # Before the last plain reply, or with K2.5's thinking off, the template never reads it.
    assert "None" not in render_text(get_template("kimi_k25").render_prompt(msgs, None, False))


@pytest.mark.parametrize("name", ["kimi_k2_thinking", "kimi_k25"])
def test_tool_result_without_tool_call_id_is_an_error_naming_the_fix(name):
    msgs = [{"role": "user", "content": "x"}, {"role": "tool", "content": "1"}]
    with pytest.raises(TemplateError, match=r"messages\[1\] \(tool\) needs tool_call_id"):
        get_template(name).render_prompt(msgs, None, True)
