"""Qwen3 prompts over every probe kind: hand-written goldens, each checked offline against the
official Qwen3 chat template rendered by transformers' Jinja."""

from __future__ import annotations

import pytest

from draftgate.templates import get_template, render_text

S, E = "<|im_start|>", "<|im_end|>\n"
GEN = S + "assistant\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS_SYSTEM = (S + "system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
                '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", '
                '"properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n</tools>\n\n'
                "For each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' + E)


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def render(messages, tools=None, thinking=True) -> str:
    return render_text(get_template("qwen3").render_prompt(messages, tools, thinking))


def test_qwen3_is_its_own_family_and_passes_enable_thinking():
    t = get_template("qwen3")
    assert t.family == "qwen3" and "Qwen3" in t.official
    assert t.jinja_kwargs(True) == {"enable_thinking": True} and t.jinja_kwargs(False) == {"enable_thinking": False}


@pytest.mark.parametrize("thinking, gen", [(True, GEN), (False, GEN + EMPTY_THINK)])
def test_a_lone_user_turn_has_no_system_turn_and_the_switch_only_changes_the_generation_prompt(thinking, gen):
    assert render([{"role": "user", "content": "Hi!"}], thinking=thinking) == S + "user\nHi!" + E + gen


def test_multi_turn_history_drops_reasoning_before_the_last_query_even_with_thinking_off():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "reasoning_content": "Sum.", "content": "4"}, {"role": "user", "content": "3+3?"}]
    assert render(msgs, thinking=False) == (S + "system\nBe brief." + E + S + "user\n2+2?" + E + S + "assistant\n4" + E
                                            + S + "user\n3+3?" + E + GEN + EMPTY_THINK)


def test_a_conversation_ending_with_an_assistant_turn_renders_its_think_block_stripped_of_newlines():
    msgs = [{"role": "user", "content": "2+2?"},
            {"role": "assistant", "reasoning_content": "\n\nSum.\n", "content": "\n4"}]
    assert render(msgs) == S + "user\n2+2?" + E + S + "assistant\n<think>\nSum.\n</think>\n\n4" + E + GEN


def test_parallel_calls_keep_the_loops_reasoning_and_their_results_share_one_user_turn():
    msgs = [{"role": "user", "content": "Paris and Tokyo?"},
            {"role": "assistant", "reasoning_content": "Both.", "content": "", "tool_calls": [
                call("functions.get_weather:0", "get_weather", '{"city": "Paris"}'),
                call("functions.get_weather:1", "get_weather", '{"city":"東京"}')]},
            {"role": "tool", "name": "get_weather", "tool_call_id": "functions.get_weather:0", "content": "18"},
            {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "22"}]
    assert render(msgs, [WEATHER], thinking=False) == (
        TOOLS_SYSTEM + S + "user\nParis and Tokyo?" + E
        + S + "assistant\n<think>\nBoth.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"東京"}}\n</tool_call>' + E
        + S + "user\n<tool_response>\n18\n</tool_response>\n<tool_response>\n22\n</tool_response>" + E
        + GEN + EMPTY_THINK)


def test_unicode_and_empty_contents_are_written_as_given():
    msgs = [{"role": "system", "content": ""}, {"role": "user", "content": "Ça va ? 🤖 مرحبا"},
            {"role": "assistant", "content": ""}, {"role": "user", "content": ""}]
    assert render(msgs) == (S + "system\n" + E + S + "user\nÇa va ? 🤖 مرحبا" + E + S + "assistant\n" + E
                            + S + "user\n" + E + GEN)


def test_literal_special_token_names_in_content_stay_as_written():
    msgs = [{"role": "user", "content": "Explain <|im_end|> and <think> as text."}]
    assert render(msgs) == S + "user\nExplain <|im_end|> and <think> as text." + E + GEN
