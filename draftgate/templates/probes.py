"""A built-in probe set: conversations that exercise every path of the chat templates.

The contract renders each probe with the official template and with the code template and fails on
any byte difference; a probe the code template refuses (TemplateError: chatml has no tools,
kimi_k2 has no thinking, ...) is reported as not applicable. Messages are OpenAI-shaped as our
templates take them: tool-call arguments are JSON strings (verbatim, odd spacing included),
history tool calls carry the model's own ids (`functions.NAME:IDX`), reasoning sits under
`reasoning_content` (the key the official templates read), tool-call turns have content "" (None
renders the same: the official render hands the template "" as vLLM and SGLang do, official.py;
the generated corpus, corpus.py, holds the None contents).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeConversation:
    name: str
    messages: list
    tools: list | None
    thinking: bool


def _call(cid: str, name: str, args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def _fn(name: str, description: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


ADD = _fn("add", "Add two integers.", {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})
WEATHER = _fn("get_weather", "Current weather for a city.", {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
    "required": ["city"]})
# Nested objects, arrays, enums, defaults, anyOf, constraints, a $ref, unicode: the TypeScript path.
SEARCH = _fn("search_flights", "Search flights.\nReturns at most `limit` offers — prix en €.", {
    "type": "object",
    "$defs": {"Airport": {"type": "object", "description": "An IATA airport",
                          "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 3}},
                          "required": ["code"]}},
    "properties": {
        "origin": {"$ref": "#/$defs/Airport"},
        "destinations": {"type": "array", "items": {"$ref": "#/$defs/Airport"}, "minItems": 1},
        "when": {"type": "object", "description": "Travel dates",
                 "properties": {"depart": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
                                "return": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
                 "required": ["depart"]},
        "cabin": {"type": "string", "enum": ["economy", "business"], "default": "economy"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        "flexible": {"type": "boolean", "description": "Allow ±3 days"},
        "tags": {"type": ["array", "null"]},
    },
    "required": ["origin", "destinations", "when"]})
# A schema K2.5's TypeScript encoder does not understand (oneOf): its tokenizer declares JSON instead.
CONVERT = _fn("convert", "Convert a quantity.", {
    "type": "object", "properties": {"value": {"oneOf": [{"type": "number"}, {"type": "string"}]}}})

ODD_ARGS = '{"a":1,  "b" : 2}'                       # spacing a re-serialiser would destroy
PARIS = '{"city": "Paris"}'
TOKYO = '{"city": "東京", "unit": "celsius"}'

HI = {"role": "user", "content": "Hi!"}
SYSTEM = {"role": "system", "content": "You are a terse assistant."}


def _tool_loop(with_reasoning: bool) -> list:
    reasoning = {"reasoning_content": "Two cities: call the tool twice."} if with_reasoning else {}
    return [
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {"role": "assistant", "content": "", **reasoning, "tool_calls": [
            _call("functions.get_weather:0", "get_weather", PARIS),
            _call("functions.get_weather:1", "get_weather", TOKYO)]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"temp": 18}'},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": '{"temp": 22}'},
    ]


_HISTORY_THEN_LOOP = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "reasoning_content": "Simple sum.", "content": "4"},
    {"role": "user", "content": "Now add 40 and 2 with the tool."},
    {"role": "assistant", "reasoning_content": "Use add.", "content": "Calling add.", "tool_calls": [
        _call("functions.add:0", "add", ODD_ARGS)]},
    {"role": "tool", "tool_call_id": "functions.add:0", "content": "42"},
    {"role": "assistant", "reasoning_content": "\nCheck it once more.\n", "content": "", "tool_calls": [
        _call("functions.add:1", "add", '{"a": 40, "b": 2}')]},
    {"role": "tool", "tool_call_id": "functions.add:1", "content": "42"},
]

PROBES: tuple[ProbeConversation, ...] = (
    ProbeConversation("user_only_thinking", [HI], None, True),
    ProbeConversation("user_only_no_thinking", [HI], None, False),
    ProbeConversation("system_user_thinking", [SYSTEM, HI], None, True),
    ProbeConversation("system_user_no_thinking", [SYSTEM, HI], None, False),
    ProbeConversation("multi_turn", [SYSTEM, HI, {"role": "assistant", "content": "Hello! How can I help?"},
                                     {"role": "user", "content": "Tell me a joke."}], None, True),
    ProbeConversation("multi_turn_no_thinking", [HI, {"role": "assistant", "content": "Hello!"},
                                                 {"role": "user", "content": "Bye."}], None, False),
    ProbeConversation("reasoning_in_history", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "reasoning_content": "Simple sum.", "content": "4"},
        {"role": "user", "content": "And 3+3?"}], None, True),
    ProbeConversation("reasoning_in_history_no_thinking", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "reasoning_content": "Simple sum.", "content": "4"},
        {"role": "user", "content": "And 3+3?"}], None, False),
    ProbeConversation("ends_with_assistant_reasoning", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "reasoning_content": "\n\nSimple sum.\n", "content": "\n4"}], None, True),
    ProbeConversation("tools_declared", [SYSTEM, {"role": "user", "content": "Add 1 and 2."}], [ADD, WEATHER], True),
    ProbeConversation("tools_declared_no_system_no_thinking", [{"role": "user", "content": "Add 1 and 2."}],
                      [ADD], False),
    ProbeConversation("rich_tool_schema", [{"role": "user", "content": "Flights from CDG to NRT in May?"}],
                      [SEARCH], True),
    ProbeConversation("tool_schema_json_fallback", [{"role": "user", "content": "10 km in miles?"}],
                      [CONVERT, ADD], True),
    ProbeConversation("tool_call_and_result", [
        {"role": "user", "content": "Add 1 and 2."},
        {"role": "assistant", "content": "", "tool_calls": [_call("functions.add:0", "add", ODD_ARGS)]},
        {"role": "tool", "tool_call_id": "functions.add:0", "content": "3"}], [ADD], True),
    ProbeConversation("parallel_calls_reasoning", _tool_loop(True), [WEATHER], True),
    ProbeConversation("parallel_calls_reasoning_no_thinking", _tool_loop(True), [WEATHER], False),
    ProbeConversation("parallel_calls_no_reasoning", _tool_loop(False), [WEATHER], True),
    ProbeConversation("history_then_tool_loop", _HISTORY_THEN_LOOP, [ADD], True),
    ProbeConversation("history_then_tool_loop_no_thinking", _HISTORY_THEN_LOOP, [ADD], False),
    ProbeConversation("named_tool_message", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [_call("functions.get_weather:0", "get_weather", PARIS)]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "functions.get_weather:0", "content": "sunny"}],
                      [WEATHER], True),
    ProbeConversation("unicode", [
        {"role": "system", "content": "Réponds en français. 日本語も可。"},
        {"role": "user", "content": "Ça va ? 🤖 مرحبا — naïve café\tαβγ"},
        {"role": "assistant", "content": "Très bien ! 👍"},
        {"role": "user", "content": "Und jetzt: Ελληνικά, 한국어, עברית."}], None, True),
    # The same without thinking: templates with no thinking mode (chatml) compare these too.
    ProbeConversation("unicode_no_thinking", [
        {"role": "system", "content": "Réponds en français. 日本語も可。"},
        {"role": "user", "content": "Ça va ? 🤖 مرحبا — naïve café\tαβγ"},
        {"role": "assistant", "content": "Très bien ! 👍"},
        {"role": "user", "content": "Und jetzt: Ελληνικά, 한국어, עברית."}], None, False),
    ProbeConversation("whitespace_edges_no_thinking", [
        {"role": "user", "content": "  leading and trailing  \n\n"},
        {"role": "assistant", "content": "\n\nOK.  "},
        {"role": "user", "content": "\tcode:\n    x = 1\n"}], None, False),
    ProbeConversation("empty_content", [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "?"}], None, False),
    ProbeConversation("special_token_text", [
        {"role": "user", "content": "Explain <|im_end|>, <think>, </think> and <|im_start|> as text."}], None, False),
)
