import json
import re
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftgate.config import PromptsParams
from draftgate.prompts import REASONS, Prompt, RawRecord, Reject, process, prompt_id_of, split_of, stage_metrics
from draftgate import schema
from prompts_fixtures import ingest, shuffled_lines

USER = {"role": "user", "content": "What is 2 + 2?"}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def line(obj, file="set.jsonl", index=1):
    data = obj if isinstance(obj, bytes) else json.dumps(obj, ensure_ascii=False).encode()
    return RawRecord(file, index, data)


def lines(objs, file="set.jsonl"):
    return [line(o, file, i) for i, o in enumerate(objs, start=1)]


# ---------------------------------------------------------------- one reject per reason code

BAD = {
    "invalid_utf8": b'{"messages": [{"role": "user", "content": "caf\xe9"}]}',
    "invalid_json": b'{"messages": [',
    "not_an_object": b'[{"role": "user", "content": "hi"}]',
    "no_messages": {"prompt": "hi"},
    "no_user_turn": {"messages": [{"role": "system", "content": "Be brief."}]},
    "unknown_role": {"messages": [{"role": "developer", "content": "Be brief."}, USER]},
    "empty_content": {"messages": [{"role": "user", "content": "   "}]},
    "bad_message": {"messages": [{"role": "user", "content": ["hi"]}]},
    "bad_tools": {"messages": [USER], "tools": {"get_weather": {}}},
    "bad_tool_schema": {"messages": [USER], "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "strng"}}}}}]},
    "bad_mode": {"messages": [USER], "thinking": "yes"},
}


def test_every_reason_code_has_a_minimal_bad_record():
    assert set(BAD) == set(REASONS)


@pytest.mark.parametrize("reason", REASONS)
def test_a_minimal_bad_record_is_rejected_with_its_reason_and_file_line(reason):
    out = process(line(BAD[reason], "mixed.jsonl", 7))
    assert isinstance(out, Reject)
    assert (out.reason, out.source) == (reason, "mixed.jsonl:7")
    assert out.detail and out.record


def test_a_lone_surrogate_escape_is_invalid_utf8_not_a_crash_at_write_time():
    out = process(line(b'{"messages": [{"role": "user", "content": "\\ud800 hi"}]}'))
    assert out.reason == "invalid_utf8" and "surrogate" in out.detail


def test_nan_and_overflowing_numbers_are_invalid_json():
    assert process(line(b'{"messages": [], "x": NaN}')).reason == "invalid_json"
    assert process(line(b'{"messages": [], "x": 1e999}')).reason == "invalid_json"


def test_tool_parameters_that_are_not_an_object_schema_are_bad_tool_schema():
    tool = {"name": "f", "parameters": {"type": "array", "items": {"type": "string"}}}
    out = process(line({"messages": [USER], "tools": [tool]}))
    assert out.reason == "bad_tool_schema" and "'object'" in out.detail


def test_a_tool_result_must_answer_an_earlier_call():
    msgs = [USER, {"role": "tool", "tool_call_id": "call_9", "content": "4"}]
    out = process(line({"messages": msgs}))
    assert out.reason == "bad_message" and "call_9" in out.detail


def test_a_sharegpt_observation_without_a_function_call_is_bad_message():
    conv = [{"from": "human", "value": "hi"}, {"from": "observation", "value": "4"}]
    assert process(line({"conversations": conv})).reason == "bad_message"


def test_dict_tool_call_arguments_in_openai_shape_are_rejected_with_the_fix():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    msgs = [USER, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "sun"}]
    out = process(line({"messages": msgs}))
    assert out.reason == "bad_message" and "JSON string" in out.detail


def test_a_parquet_row_is_located_by_file_and_row_number():
    out = process(RawRecord("more.parquet", 3, {"messages": None}))
    assert (out.reason, out.source) == ("no_messages", "more.parquet:row 3")


def test_a_blank_line_is_skipped_and_counted():
    result = ingest([line({"messages": [USER]}), RawRecord("set.jsonl", 2, b"  ")], PromptsParams())
    assert (len(result.rows), result.tally.rows_in, result.tally.blank_lines, result.reject_rows) == (1, 1, 1, [])


# ---------------------------------------------------------------- normalisation

def test_the_final_assistant_turn_is_dropped_and_counted():
    out = process(line({"messages": [USER, {"role": "assistant", "content": "4"}]}))
    assert json.loads(out.messages) == [USER] and out.dropped_final_assistant
    assert out.prompt_id == process(line({"messages": [USER]})).prompt_id


def test_sharegpt_and_openai_shapes_of_one_conversation_share_a_prompt_id():
    openai = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Weather in Oslo?"}]}
    sharegpt = {"system": "Be brief.", "conversations": [
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}, {"from": "human", "value": "Weather in Oslo?"}]}
    a, b = process(line(openai)), process(line(sharegpt))
    assert isinstance(a, Prompt) and a.prompt_id == b.prompt_id and a.messages == b.messages


def test_sharegpt_tool_conversations_with_tools_as_json_text_match_the_openai_shape():
    args = {"city": "Zürich"}
    sharegpt = {"tools": json.dumps([WEATHER_TOOL["function"]]), "conversations": [
        {"from": "human", "value": "Weather in Zürich?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": args})},
        {"from": "observation", "value": "12 C, cloudy"}]}
    call = {"id": "call_0", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(args, ensure_ascii=False)}}
    openai = {"tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "Weather in Zürich?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "12 C, cloudy"}]}
    a, b = process(line(sharegpt)), process(line(openai))
    assert isinstance(a, Prompt) and a.prompt_id == b.prompt_id
    assert json.loads(a.messages)[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Zürich"}'


def test_tool_call_arguments_stay_the_verbatim_string_received():
    odd = '{"city":"Oslo" ,  "days": 2.50}'
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": odd}}
    msgs = [USER, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "sun"}]
    out = process(line({"messages": msgs, "tools": [WEATHER_TOOL]}))
    assert json.loads(out.messages)[1]["tool_calls"][0]["function"]["arguments"] == odd


def test_text_is_hashed_as_given_without_unicode_normalisation():
    composed, decomposed = "café", unicodedata.normalize("NFD", "café")
    a = process(line({"messages": [{"role": "user", "content": composed}]}))
    b = process(line({"messages": [{"role": "user", "content": decomposed}]}))
    assert a.prompt_id != b.prompt_id and json.loads(b.messages)[0]["content"] == decomposed


def test_bare_tool_definitions_are_wrapped_and_an_empty_tool_list_means_no_tools():
    bare = process(line({"messages": [USER], "tools": [WEATHER_TOOL["function"]]}))
    wrapped = process(line({"messages": [USER], "tools": [WEATHER_TOOL]}))
    assert bare.prompt_id == wrapped.prompt_id and json.loads(bare.tools) == [WEATHER_TOOL]
    assert process(line({"messages": [USER], "tools": []})).tools is None
    assert process(line({"conversations": [{"from": "human", "value": "hi"}], "tools": ""})).tools is None


def test_stored_tools_keep_the_record_key_order_while_the_id_ignores_it():
    reordered = {"function": dict(reversed(list(WEATHER_TOOL["function"].items()))), "type": "function"}
    a = process(line({"messages": [USER], "tools": [WEATHER_TOOL]}))
    b = process(line({"messages": [USER], "tools": [reordered]}))
    assert a.prompt_id == b.prompt_id
    assert a.tools.startswith('[{"type":"function"') and b.tools.startswith('[{"function"')


def test_null_valued_keys_from_parquet_struct_columns_count_as_absent():
    row = {"messages": [{"role": "user", "content": "Hi", "tool_calls": None, "tool_call_id": None, "name": None}],
           "tools": None, "id": 17}
    assert json.loads(process(RawRecord("p.parquet", 0, row)).messages) == [{"role": "user", "content": "Hi"}]


def test_the_prompt_id_is_recomputable_from_the_stored_columns():
    out = process(line({"messages": [USER], "tools": [WEATHER_TOOL]}))
    assert out.prompt_id == prompt_id_of(json.loads(out.messages), json.loads(out.tools))
    assert re.fullmatch(r"[0-9a-f]{64}", out.prompt_id)


# ---------------------------------------------------------------- the whole run

def corpus(n, file="big.jsonl"):
    return lines([{"messages": [{"role": "user", "content": f"Question number {i}?"}]} for i in range(n)], file)


def test_ids_and_splits_are_stable_across_runs_line_orders_and_file_orders():
    a = lines([{"messages": [{"role": "user", "content": f"a{i}"}]} for i in range(40)], "a.jsonl")
    b = lines([{"conversations": [{"from": "human", "value": f"b{i}"}]} for i in range(40)], "b.jsonl")
    first = ingest(a + b, PromptsParams(heldout_fraction=0.3, split_seed=5))
    second = ingest(b + shuffled_lines(a, 1), PromptsParams(heldout_fraction=0.3, split_seed=5))
    key = lambda res: {(r["prompt_id"], r["messages"], r["split"]) for r in res.rows}
    assert key(first) == key(second) and len(first.rows) == 80


def test_duplicates_collapse_to_the_first_by_file_name_then_line_and_are_counted():
    same = {"messages": [USER]}
    records = [line(same, "b.jsonl", 1), line(same, "a.jsonl", 3), line(same, "a.jsonl", 2),
               RawRecord("a.jsonl", 1, b""),
               line({"conversations": [{"from": "human", "value": USER["content"]}]}, "c.jsonl", 1)]
    result = ingest(records, PromptsParams())
    (row,) = result.rows
    assert (row["source"], row["n_duplicates"], result.tally.n_duplicates) == ("a.jsonl:2", 3, 3)
    m = stage_metrics(result.tally, PromptsParams()).to_dict()
    assert m["drops_by_reason"] == {"duplicate": 3} and m["rows_in"] == m["rows_out"] + m["dropped"]


def test_the_split_is_deterministic_and_near_the_requested_fraction():
    result = ingest(corpus(3000), PromptsParams(heldout_fraction=0.2, split_seed=0))
    splits = result.prompts.column("split").to_pylist()
    assert abs(splits.count("heldout") / len(splits) - 0.2) < 0.025
    again = ingest(corpus(3000), PromptsParams(heldout_fraction=0.2, split_seed=0))
    reseeded = ingest(corpus(3000), PromptsParams(heldout_fraction=0.2, split_seed=1))
    assert again.prompts.column("split").to_pylist() == splits != reseeded.prompts.column("split").to_pylist()


def test_a_prompt_keeps_its_split_when_other_prompts_join_the_run():
    small = {r["prompt_id"]: r["split"] for r in ingest(corpus(100), PromptsParams(heldout_fraction=0.5)).rows}
    large = {r["prompt_id"]: r["split"] for r in ingest(corpus(300), PromptsParams(heldout_fraction=0.5)).rows}
    assert all(large[k] == v for k, v in small.items())
    assert split_of("x" * 64, 0, 0.0) == "train" and split_of("x" * 64, 0, 1.0) == "heldout"


def test_max_prompts_caps_after_dedup_independent_of_line_order():
    records = corpus(50) + corpus(10, "again.jsonl")
    capped = ingest(records, PromptsParams(max_prompts=20))
    reordered = ingest(shuffled_lines(records, 3), PromptsParams(max_prompts=20))
    assert len(capped.rows) == 20 and capped.tally.n_capped == 30 and capped.tally.n_duplicates == 10
    assert {r["prompt_id"] for r in capped.rows} == {r["prompt_id"] for r in reordered.rows}
    m = stage_metrics(capped.tally, PromptsParams(max_prompts=20)).to_dict()
    assert m["drops_by_reason"] == {"duplicate": 10, "over_max_prompts": 30}
    assert m["rows_in"] == m["rows_out"] + m["dropped"] == 60


def test_a_heldout_fraction_outside_zero_to_one_is_an_error_naming_the_param():
    with pytest.raises(ValueError, match="prompts.heldout_fraction"):
        ingest([], PromptsParams(heldout_fraction=1.5))


def test_metrics_count_rejects_per_reason_dataset_and_split():
    records = lines([BAD["unknown_role"], BAD["empty_content"], {"messages": [USER]}], "chat.jsonl")
    result = ingest(records + lines([BAD["unknown_role"]], "code.jsonl"), PromptsParams(heldout_fraction=0.0))
    m = stage_metrics(result.tally, PromptsParams()).to_dict()
    assert m["drops_by_reason"] == {"unknown_role": 2, "empty_content": 1}
    assert m["datasets"] == {"chat": {"in": 3, "out": 1, "rejects": 2}, "code": {"in": 1, "out": 0, "rejects": 1}}
    assert (m["rejects_rate"], m["split"]) == (0.75, {"train": 1, "heldout": 0})


def test_tables_carry_the_schema_exactly():
    result = ingest(lines([BAD["bad_tools"], {"messages": [USER], "tools": [WEATHER_TOOL]}]), PromptsParams())
    assert result.prompts.schema == schema.prompts() and result.prompts.num_rows == 1
    assert result.rejects.schema == schema.rejects() and result.rejects.num_rows == 1


# ---------------------------------------------------------------- properties: nothing crashes

SOURCE = re.compile(r"^[\w.]+:(\d+|row \d+)$")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=8)  # surrogates included
roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", "", None, 3])
calls = st.lists(st.fixed_dictionaries(
    {"id": st.sampled_from(["c0", "c1", None]), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "", 1]), "arguments": st.sampled_from(['{"a": 1}', "{", {"a": 1}, None])})},
    optional={"type": st.sampled_from(["function", "other"])}), max_size=2)
messages = st.lists(st.fixed_dictionaries(
    {"role": roles, "content": st.one_of(st.none(), any_text, st.just("hi"), json_values)},
    optional={"tool_calls": calls, "tool_call_id": st.sampled_from(["c0", "c1", 5]), "name": any_text,
              "weight": st.integers()}), max_size=5)
turns = st.lists(st.fixed_dictionaries(
    {"from": st.sampled_from(["human", "gpt", "system", "function_call", "observation", "bot", None]),
     "value": st.one_of(any_text, st.just('{"name": "f", "arguments": {"a": 1}}'), json_values)}), max_size=5)
tools = st.one_of(st.none(), json_values, st.just([WEATHER_TOOL]), st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "g", "", None]), "parameters": st.one_of(json_values, st.just({"type": "object"}))}),
    max_size=2))
# Mostly well-formed conversations, so the accepted path is exercised as hard as the rejects.
words = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).filter(str.strip)
plausible = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "user"]), "content": words}),
                     min_size=1, max_size=5)
records = st.one_of(
    st.fixed_dictionaries({"messages": plausible}, optional={"tools": st.just([WEATHER_TOOL]), "system": words}),
    st.fixed_dictionaries({"messages": messages}, optional={"tools": tools, "system": json_values}),
    st.fixed_dictionaries({"conversations": turns}, optional={"tools": tools | tools.map(json.dumps)}),
    json_values)


def check_outcome(out):
    assert out is None or isinstance(out, (Prompt, Reject))
    if isinstance(out, Reject):
        assert out.reason in REASONS and out.detail and SOURCE.match(out.source), out
        out.record.encode("utf-8")
    if isinstance(out, Prompt):
        msgs = json.loads(out.messages)
        tools_ = None if out.tools is None else json.loads(out.tools)
        assert out.prompt_id == prompt_id_of(msgs, tools_)
        assert msgs[-1]["role"] in ("user", "tool") and any(m["role"] == "user" for m in msgs)
        assert all(m["role"] in ("system", "user", "assistant", "tool") for m in msgs)
        (out.messages + (out.tools or "")).encode("utf-8")


fast = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fast
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_and_rejects_carry_reason_and_line(data):
    check_outcome(process(RawRecord("fuzz.jsonl", 4, data)))


@fast
@given(records)
def test_random_and_malformed_records_never_crash(record):
    check_outcome(process(RawRecord("fuzz.jsonl", 1, json.dumps(record).encode())))
    check_outcome(process(RawRecord("fuzz.parquet", 0, record) if isinstance(record, dict) else RawRecord(
        "fuzz.jsonl", 2, json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass"))))


@settings(max_examples=60, deadline=None)
@given(st.lists(records, max_size=12))
def test_a_run_of_random_records_reconciles_counts_and_fits_the_schema(batch):
    recs = [RawRecord("fuzz.jsonl", i, json.dumps(r).encode()) for i, r in enumerate(batch, start=1)]
    result = ingest(recs, PromptsParams(heldout_fraction=0.5))
    m = stage_metrics(result.tally, PromptsParams()).to_dict()
    assert m["rows_in"] == len(batch) == m["rows_out"] + m["dropped"]
    assert result.prompts.schema == schema.prompts() and result.rejects.schema == schema.rejects()
    assert result.rejects.num_rows == m["dropped"] - m["drops_by_reason"].get("duplicate", 0)


def test_read_raw_numbers_lines_from_one_and_handles_bom_crlf_and_u2028(tmp_path):
    import pyarrow.parquet as pq

    from draftgate.prompts import read_raw
    from draftgate.prompts.stream import ingest_to_files

    path = tmp_path / "win.jsonl"
    first = json.dumps({"messages": [{"role": "user", "content": "a\u2028b"}]}, ensure_ascii=False)
    path.write_bytes(b"\xef\xbb\xbf" + first.encode() + b"\r\n\r\n" + b'{"messages": 1}\r\n')
    records = list(read_raw(path))
    assert [r.source for r in records] == ["win.jsonl:1", "win.jsonl:2", "win.jsonl:3"]
    tally = ingest_to_files(iter(records), PromptsParams(), tmp_path / "out")
    rows = pq.read_table(tmp_path / "out" / "prompts.parquet").to_pylist()
    assert json.loads(rows[0]["messages"])[0]["content"] == "a\u2028b"
    rejects = pq.read_table(tmp_path / "out" / "rejects.parquet").to_pylist()
    assert [(r["source"], r["reason"]) for r in rejects] == [("win.jsonl:3", "bad_message")]
    assert tally.blank_lines == 1


# ---------------------------------------------------------------- the target's context

def test_the_length_limit_is_the_context_less_max_tokens_from_the_param_or_the_tokenizers_declared_context():
    from draftgate.prompts import LengthLimit, length_limit

    assert length_limit(8192, None, 128) == LengthLimit(8064, 8192, "prompts.context_tokens")
    # deepseek's tokenizer_config declares 1,048,576
    assert length_limit(None, 1_048_576, 128) == LengthLimit(1_048_448, 1_048_576, "the tokenizer's model_max_length")
    none = length_limit(None, int(1e30), 128)      # transformers' "declares none" (the GGUF tokenizers)
    assert none.max_prompt_tokens is None and "set prompts.context_tokens" in none.source
    with pytest.raises(ValueError, match="generate.max_tokens 4096 leaves no room .* 4096 tokens"):
        length_limit(None, 4096, 4096)


def test_an_hf_model_directorys_config_gives_the_context_before_its_tokenizer_does(tmp_path):
    import json

    from draftgate.prompts import length_limit

    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 262144}}))
    limit = length_limit(None, 131072, 16384, str(tmp_path))      # a Kimi-K2.5-like multimodal config
    assert (limit.max_prompt_tokens, limit.context) == (262144 - 16384, 262144)
    assert limit.source == f"max_position_embeddings of {tmp_path}/config.json"
    assert length_limit(None, 131072, 16384, str(tmp_path / "no-such-dir")).context == 131072
