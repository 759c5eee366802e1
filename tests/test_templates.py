"""Chat templates as code: golden renders, ids through the real tokenizers, the GGUF's own Jinja."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftgate.templates import (
    Completion, MissingSpecialError, Special, TemplateError, Text, ToolCall, encode_segments,
    encode_segments_spans, get_template, merge_text, render_text,
)

ODD_ARGS = '{"a":1,  "b" : [1,2]}'          # spacing a re-serialiser would destroy
WEATHER_ARGS = '{"city": "Paris"}'
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
TWO_CALLS = (ToolCall("add", ODD_ARGS, "add:0"), ToolCall("get_weather", WEATHER_ARGS, None))


def split_specials(golden: str, names) -> list:
    """A golden string back into segments: every occurrence of a special name is that special."""
    pattern = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return merge_text(Special(p) if p in names else Text(p) for p in re.split(f"({pattern})", golden))


def assert_renders(segments, golden: str, template) -> None:
    assert render_text(segments) == golden
    assert segments == split_specials(golden, template.special_names)


def history_call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def special_ids(tok, template) -> dict[str, int]:
    # By name, the way the contract resolves them.
    ids = {n: tok.token_id(n) for n in template.special_names}
    assert None not in ids.values(), ids
    return ids


# ---------------------------------------------------------------- chatml (SmolLM2)

SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def test_chatml_injects_smollm2_default_system_and_ends_with_generation_prefix():
    t = get_template("chatml")
    segs = t.render_prompt([{"role": "user", "content": "What is 2+2?"}], None, False)
    assert_renders(segs, SMOL_SYSTEM + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", t)


def test_chatml_multi_turn_with_tool_result_keeps_the_given_system_turn():
    t = get_template("chatml")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "tool", "content": "ok"},
            {"role": "user", "content": "3+3?"}]
    assert_renders(t.render_prompt(msgs, None, False),
                   "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                   "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n"
                   "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n", t)


def test_chatml_completion_ends_with_im_end_unless_truncated():
    t = get_template("chatml")
    assert_renders(t.render_completion(Completion(None, "4"), False), "4<|im_end|>", t)
    assert_renders(t.render_completion(Completion(None, "The ans", truncated=True), False), "The ans", t)


@pytest.mark.parametrize("call", [
    lambda t: t.render_prompt([{"role": "user", "content": "x"}], [ADD_TOOL], False),
    lambda t: t.render_prompt([{"role": "assistant", "content": "", "tool_calls": [
        history_call("c", "add", "{}")]}], None, False),
    lambda t: t.render_prompt([{"role": "assistant", "content": "4", "reasoning": "r"}], None, False),
    lambda t: t.render_completion(Completion("thought", "4"), False),
    lambda t: t.render_completion(Completion(None, "", TWO_CALLS), False),
    lambda t: t.render_prompt([{"role": "user", "content": "x"}], None, True),
], ids=["tools", "history_tool_calls", "history_reasoning", "reasoning", "tool_calls", "thinking"])
def test_chatml_refuses_what_the_smollm2_template_would_silently_drop(call):
    with pytest.raises(TemplateError, match="chatml"):
        call(get_template("chatml"))


# ---------------------------------------------------------------- qwen3

def test_qwen3_thinking_completion_strips_reasoning_newlines_inside_the_think_block():
    t = get_template("qwen3")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert_renders(t.render_prompt(msgs, None, True),
                   "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                   "<|im_start|>assistant\n", t)
    assert_renders(t.render_completion(Completion("\nAdd them.\n\n", "4"), True),
                   "<think>\nAdd them.\n</think>\n\n4<|im_end|>", t)


def test_qwen3_empty_reasoning_still_renders_the_think_block():
    t = get_template("qwen3")
    assert_renders(t.render_completion(Completion("", "4"), True), "<think>\n\n</think>\n\n4<|im_end|>", t)


def test_qwen3_thinking_disabled_puts_the_empty_think_block_in_the_prompt():
    t = get_template("qwen3")
    segs = t.render_prompt([{"role": "user", "content": "2+2?"}], None, False)
    assert_renders(segs, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", t)
    assert_renders(t.render_completion(Completion(None, "4"), False), "4<|im_end|>", t)
    with pytest.raises(TemplateError, match="thinking is disabled"):
        t.render_completion(Completion("thought", "4"), False)


def test_qwen3_two_tool_calls_only_pass_arguments_through_verbatim():
    t = get_template("qwen3")
    assert_renders(t.render_completion(Completion("Call both.", None, TWO_CALLS), True),
                   "<think>\nCall both.\n</think>\n\n"
                   '<tool_call>\n{"name": "add", "arguments": {"a":1,  "b" : [1,2]}}\n</tool_call>\n'
                   '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
                   "<|im_end|>", t)


def test_qwen3_content_before_a_tool_call_is_followed_by_a_newline():
    t = get_template("qwen3")
    assert_renders(t.render_completion(Completion(None, "Let me add.", TWO_CALLS[:1]), False),
                   'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a":1,  "b" : [1,2]}}\n'
                   "</tool_call><|im_end|>", t)


def test_qwen3_truncated_completion_has_no_end_token_and_leaves_an_unfinished_think_open():
    t = get_template("qwen3")
    assert_renders(t.render_completion(Completion("Let me th", None, truncated=True), True),
                   "<think>\nLet me th", t)
    assert_renders(t.render_completion(Completion("R", "part", truncated=True), True),
                   "<think>\nR\n</think>\n\npart", t)


def test_qwen3_tools_go_into_the_system_turn_with_the_official_wording():
    t = get_template("qwen3")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "add 1 and 2"}]
    segs = t.render_prompt(msgs, [ADD_TOOL], True)
    assert_renders(segs,
                   "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
                   "assist with the user query.\n\nYou are provided with function signatures within "
                   "<tools></tools> XML tags:\n<tools>\n"
                   '{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}\n'
                   "</tools>\n\nFor each function call, return a json object with function name and "
                   "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                   '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
                   "<|im_start|>user\nadd 1 and 2<|im_end|>\n<|im_start|>assistant\n", t)
    # <tool_call> is an added token: the serving engine turns the wording's tags into its id too.
    assert segs.count(Special("<tool_call>")) == 2


def test_qwen3_history_drops_reasoning_before_the_last_query_and_keeps_it_in_the_tool_loop():
    t = get_template("qwen3")
    msgs = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning": "Greet.", "content": "Hello!"},
        {"role": "user", "content": "Weather in Paris and 1+2?"},
        {"role": "assistant", "reasoning": "Two tools.", "content": "", "tool_calls": [
            history_call("call_1", "get_weather", WEATHER_ARGS), history_call("call_2", "add", {"a": 1, "b": 2})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "3"},
    ]
    assert_renders(t.render_prompt(msgs, None, True),
                   "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                   "<|im_start|>user\nWeather in Paris and 1+2?<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\nTwo tools.\n</think>\n\n"
                   '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                   '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>\n'
                   "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n"
                   "<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n", t)


def test_qwen3_history_reasoning_written_inline_in_content_is_split_off_like_the_official_template():
    t = get_template("qwen3")
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nGreet.\n</think>\n\nHello!"},
            {"role": "user", "content": "Bye"}]
    assert_renders(t.render_prompt(msgs, None, True),
                   "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                   "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", t)


# ---------------------------------------------------------------- ids through the real tokenizers

CONVERSATION = [
    {"role": "system", "content": "You talk about <|im_end|> and <think> tags."},
    {"role": "user", "content": "Weather in Paris and 1+2?"},
    {"role": "assistant", "reasoning": "Two tools.", "content": "", "tool_calls": [
        history_call("functions.get_weather:0", "get_weather", WEATHER_ARGS)]},
    {"role": "tool", "name": "get_weather", "tool_call_id": "functions.get_weather:0", "content": "18C"},
]
LITERAL = "A literal <|im_end|> or <think> in text stays text."


@pytest.mark.parametrize("name, tok_fixture, with_tools", [
    ("qwen3", "qwen3_tok", True), ("kimi_k2_thinking", "kimi_standin_tok", True),
    ("kimi_k25", "kimi_standin_tok", True),
    ("chatml", "smollm2_tok", False),
])
def test_rendered_ids_decode_to_the_rendered_text_and_specials_get_single_ids(name, tok_fixture, with_tools,
                                                                             request):
    tok, t = request.getfixturevalue(tok_fixture), get_template(name)
    ids = special_ids(tok, t)
    if with_tools:
        prompt = t.render_prompt(CONVERSATION, [ADD_TOOL], True)
        completion = t.render_completion(Completion("Think <|im_end|>.", LITERAL, TWO_CALLS), True)
    else:
        prompt = t.render_prompt(CONVERSATION[:2], None, False)
        completion = t.render_completion(Completion(None, LITERAL), False)
    enc = encode_segments_spans(tok, [prompt, completion], ids)
    for segs, e in zip((prompt, completion), enc):
        assert tok.decode(e.ids) == render_text(segs)
        for s, (a, b) in zip(segs, e.spans):
            if type(s) is Special:
                assert e.ids[a:b] == [ids[s.name]]
            else:  # text holds ordinary ids only, even where it spells a special token's name
                assert set(e.ids[a:b]).isdisjoint(ids.values()), (s, e.ids[a:b])
    assert render_text(completion).count(LITERAL) == 1


def test_qwen3_ids_of_specials_are_the_real_vocabulary_facts(qwen3_tok):
    ids = special_ids(qwen3_tok, get_template("qwen3"))
    assert (ids["<|im_end|>"], ids["<tool_call>"], ids["<think>"], ids["</think>"]) == (151645, 151657, 151667, 151668)


@pytest.mark.parametrize("name", ["kimi_k2", "kimi_k2_thinking", "kimi_k25"])
def test_kimi_im_end_resolves_to_163586_not_the_ordinary_163533(kimi_standin_tok, name):
    ids = special_ids(kimi_standin_tok, get_template(name))
    assert ids["<|im_end|>"] == 163586


@pytest.mark.parametrize("name, tok_fixture", [("qwen3", "qwen3_tok"), ("kimi_k2_thinking", "kimi_standin_tok"),
                                              ("kimi_k25", "kimi_standin_tok")])
def test_tool_call_arguments_come_back_byte_for_byte_from_their_ids(name, tok_fixture, request):
    tok, t = request.getfixturevalue(tok_fixture), get_template(name)
    args = ['{"a":1,  "b" : [1,2]}', '{\n  "q": "caf\\u00e9 <|im_end|>",\t"n": 1e3 }', "not json at all ]"]
    c = Completion(None, "", tuple(ToolCall("add", a, f"add:{k}") for k, a in enumerate(args)))
    segs = t.render_completion(c, True)
    e = encode_segments_spans(tok, [segs], special_ids(tok, t))[0]
    pieces = [tok.decode(e.ids[a:b]) for s, (a, b) in zip(segs, e.spans) if type(s) is Text]
    for a in args:
        assert any(a in p for p in pieces), a


def test_encode_segments_makes_one_tokenizer_call_for_the_whole_batch(qwen3_tok):
    calls = []

    class Counting:
        def encode_ordinary_batch(self, texts):
            calls.append(len(texts))
            return qwen3_tok.encode_ordinary_batch(texts)

    t = get_template("qwen3")
    batch = [t.render_completion(Completion(f"r{i}", f"c{i}", TWO_CALLS), True) for i in range(50)]
    out = encode_segments(Counting(), batch, special_ids(qwen3_tok, t))
    assert len(calls) == 1 and calls[0] == sum(type(s) is Text for row in batch for s in row)
    assert [qwen3_tok.decode(ids) for ids in out] == [render_text(row) for row in batch]


def test_encode_segments_names_a_special_missing_from_the_contract(qwen3_tok):
    segs = get_template("qwen3").render_completion(Completion("r", "c"), True)
    with pytest.raises(MissingSpecialError, match=r"'</think>' \(row 0\) has no id"):
        encode_segments(qwen3_tok, [segs], {"<think>": 1, "<|im_end|>": 2})


def test_text_boundaries_merge_so_merge_text_joins_adjacent_text(qwen3_tok):
    # ("foo", "bar") -> 7975, 2257 apart but 50267 joined (docs/tokenizers.md): segments must be canonical.
    assert merge_text([Text("foo"), Text(""), Text("bar"), Special("<think>")]) == [Text("foobar"), Special("<think>")]
    assert encode_segments(qwen3_tok, [[Text("foobar")]], {}) == [[50267]]


def test_pieces_encode_each_distinct_text_once_and_join_to_the_same_ids_as_encode_segments(qwen3_tok):
    from draftgate.templates.encode import Pieces

    calls = []

    class Counting:
        def encode_ordinary_batch(self, texts):
            calls.append(list(texts))
            return qwen3_tok.encode_ordinary_batch(texts)

    t = get_template("qwen3")
    ids = special_ids(qwen3_tok, t)
    # Rows that share text: the generation prefix, role headers, one prompt asked twice.
    batch = [t.render_prompt([{"role": "user", "content": f"Q{i % 3} <|im_end|> stays text"}], [ADD_TOOL], True)
             for i in range(6)]
    batch += [t.render_completion(Completion(f"r{i % 2}", LITERAL, TWO_CALLS[:i % 3]), True) for i in range(6)]
    pieces = Pieces(ids)
    plans = [pieces.plan(segs, k) for k, segs in enumerate(batch)]
    pieces.encode(Counting())
    texts = [s.text for segs in batch for s in segs if type(s) is Text]
    assert len(calls) == 1 and sorted(calls[0]) == sorted(set(texts)) and len(calls[0]) < len(texts)
    assert [pieces.ids(plan) for plan in plans] == encode_segments(qwen3_tok, batch, ids)


def test_pieces_refuse_a_special_missing_from_the_contract_and_text_planned_after_encoding(qwen3_tok):
    from draftgate.templates.encode import Pieces

    segs = get_template("qwen3").render_completion(Completion("r", "c"), True)
    with pytest.raises(MissingSpecialError, match=r"'</think>' \(row p7\) has no id"):
        Pieces({"<think>": 1, "<|im_end|>": 2}).plan(segs, "p7")
    pieces = Pieces({})
    pieces.plan([Text("a")])
    pieces.encode(qwen3_tok)
    assert pieces.plan([Text("a")]) == [0]          # known text: its piece is there
    with pytest.raises(RuntimeError, match="planned after encode"):
        pieces.plan([Text("b")])
    with pytest.raises(TypeError, match="neither Text nor Special"):
        pieces.plan(["raw string"])


# ---------------------------------------------------------------- chatml == the GGUF's own Jinja

PIECES = ["Hello", " world", "\n", "\n\n", "  ", "é", "日本", "x = (", "))", "{\"a\": 1}", "<", "|", ">",
          "im_start", "system", "assistant", "\t", "42", "🤖", "</s>"]
content = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=8).map("".join)
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]),
                                 "content": content})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(message, min_size=1, max_size=6))
def test_chatml_render_and_ids_equal_the_smollm2_gguf_jinja_template(smollm2_tok, messages):
    t = get_template("chatml")
    segs = t.render_prompt(messages, None, False)
    jinja = smollm2_tok.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render_text(segs) == jinja
    ours = encode_segments(smollm2_tok, [segs], special_ids(smollm2_tok, t))[0]
    if all(smollm2_tok.encode(m["content"]) == smollm2_tok.encode_ordinary(m["content"]) for m in messages):
        # No added token spelled inside the content: a serving engine's full-string encode agrees.
        assert ours == smollm2_tok.encode(jinja)
    else:
        assert ours != smollm2_tok.encode(jinja)


def test_smollm2_tokenizer_ships_the_chat_template_we_reproduce(smollm2_tok):
    from draftgate.templates.chatml import SMOLLM2_DEFAULT_SYSTEM

    assert SMOLLM2_DEFAULT_SYSTEM in smollm2_tok.chat_template


@pytest.mark.parametrize("name", ["chatml", "qwen3", "kimi_k2", "kimi_k2_thinking", "kimi_k25"])
@pytest.mark.parametrize("messages, match", [
    ([], "messages is empty"),
    ([{"role": "developer", "content": "x"}], r"messages\[0\]\.role is 'developer'"),
    ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], r"messages\[0\]\.content is a list"),
    ([{"role": "user"}], r"messages\[0\] \(user\) has no content"),
])
def test_malformed_messages_fail_naming_the_message_and_the_fix(name, messages, match):
    with pytest.raises(TemplateError, match=match):
        get_template(name).render_prompt(messages, None, name not in ("chatml", "kimi_k2"))


@pytest.mark.parametrize("name", ["chatml", "qwen3", "kimi_k2", "kimi_k2_thinking", "kimi_k25"])
def test_end_think_and_tool_markers_are_among_the_names_the_contract_verifies(name):
    t = get_template(name)
    used = {t.end_token, *(t.think_tokens or ()), *(n for pair in t.tool_marker_pairs for n in pair)}
    assert used <= t.special_names


def test_get_template_lists_the_choices_for_an_unknown_name():
    with pytest.raises(TemplateError, match="chatml, qwen3, kimi_k2, kimi_k2_thinking, kimi_k25"):
        get_template("llama3")


def test_deepseek_is_refused_with_the_reason_instead_of_a_guessed_format():
    with pytest.raises(TemplateError, match="not implemented: no official chat template"):
        get_template("deepseek")


# ---------------------------------------------------------------- every template, and the built-in probes

@pytest.mark.parametrize("name, family, kwargs", [
    ("chatml", "chatml", {}), ("qwen3", "qwen3", {"enable_thinking": False}), ("kimi_k2", "kimi", {}),
    ("kimi_k2_thinking", "kimi", {}), ("kimi_k25", "kimi", {"thinking": False}),
])
def test_every_template_names_its_family_its_official_file_and_the_kwargs_that_file_needs(name, family, kwargs):
    t = get_template(name)
    assert (t.family, t.jinja_kwargs(False)) == (family, kwargs)
    assert t.official and "\n" not in t.official


def test_the_probe_set_covers_every_kind_of_conversation_once_by_name():
    from draftgate.templates.probes import PROBES

    names = [p.name for p in PROBES]
    assert 15 <= len(PROBES) <= 25 and len(set(names)) == len(names)
    msgs = [(p, m) for p in PROBES for m in p.messages]
    assert {True, False} == {p.thinking for p in PROBES}
    assert any(p.messages[0]["role"] == "system" for p in PROBES)
    assert any(p.messages[0]["role"] != "system" for p in PROBES)
    assert any(sum(m["role"] == "user" for m in p.messages) > 1 for p in PROBES)             # multi-turn
    assert any(m.get("reasoning_content") for _, m in msgs)                                  # reasoning in history
    assert any(len(m.get("tool_calls", [])) > 1 for _, m in msgs)                            # parallel calls
    assert any(m["role"] == "tool" for _, m in msgs) and any(p.tools for p in PROBES)
    assert any(m.get("content") == "" for _, m in msgs)                                      # empty content
    assert any(any(ord(c) > 0x2000 for c in m["content"]) for _, m in msgs)                  # unicode
    for _, m in msgs:
        for tc in m.get("tool_calls", []):
            assert isinstance(tc["function"]["arguments"], str) and tc["id"].startswith("functions.")


@pytest.mark.parametrize("name", ["chatml", "qwen3", "kimi_k2", "kimi_k2_thinking", "kimi_k25"])
def test_every_probe_renders_or_is_refused_as_not_applicable(name):
    from draftgate.templates.probes import PROBES

    t, rendered = get_template(name), 0
    for p in PROBES:
        try:
            text = render_text(t.render_prompt(p.messages, p.tools, p.thinking))
        except TemplateError:
            continue
        rendered += 1
        assert p.messages[-1]["content"] in text
    # Qwen3 and K2.5 take every probe; the others refuse what their template has no slot for.
    assert rendered == len(PROBES) if name in ("qwen3", "kimi_k25") else 0 < rendered < len(PROBES)
