"""A seeded generated corpus for the template contract, beside the fixed probes (probes.py).

25 hand-written probes miss whole classes of template logic: the official Kimi-K2-Thinking template
with one `{%- break -%}` removed (a patched copy in circulation) differs from the real one on no
fixed probe, because it only shows when TWO plain assistant replies precede the live turn and the
later one carries reasoning. So the contract also renders conversations composed at random from
the episodes real traffic has: plain exchanges with and without reasoning in history, tool loops
after plain turns, parallel calls, tool results with and without a `name`, unicode and whitespace
edges, empty and None contents, declared-but-unused tools, conversations ending in a live tool
loop or an assistant turn, and thinking on and off.

Same shape as the probes (ProbeConversation) and the same conventions: tool-call arguments are JSON
strings, history tool calls carry the model's ids (`functions.NAME:IDX`, a running count), reasoning
sits under `reasoning_content`. A template may refuse a conversation (code_refuses: chatml has no
tools); the contract fails only where both render and differ, or where only the code renders.
Deterministic for a seed: `random.Random(seed)` and nothing else.
"""

from __future__ import annotations

import json
import random

from draftgate.templates.probes import ADD, CONVERT, SEARCH, WEATHER, ProbeConversation

TEXTS = (
    "Hi!", "What is 2+2?", "Tell me a joke.", "Summarise this in one line.", "Thanks.",
    "Ça va ? naïve café", "日本語で答えてください。", "مرحبا 🤖", "Ελληνικά, 한국어, עברית.",
    "  leading and trailing  \n\n", "\tcode:\n    x = 1\n", "line one\nline two", "100% sure? {braces} [x]",
)
# Assistant text avoids the literal "</think>": Qwen3's template splits content on it, which is
# the reasoning format's business, not the corpus's (the fixed probe special_token_text has it).
REPLIES = ("4", "Hello! How can I help?", "Sure.", "Très bien ! 👍", "\n\nOK.  ", "Done:\n- a\n- b", "はい。")
REASONING = ("Simple sum.", "\nCheck it once more.\n", "The user greets me.", "Two cities: call the tool twice.",
             "考えます。", "\n\n")
ARGS = {"add": ('{"a": 1, "b": 2}', '{"a":1,  "b" : 2}', '{"a": 40, "b": 2}'),
        "get_weather": ('{"city": "Paris"}', '{"city": "東京", "unit": "celsius"}'),
        "search_flights": ('{"origin": {"code": "CDG"}, "destinations": [{"code": "NRT"}], "when": {"depart": "2025-05-01"}}',),
        "convert": ('{"value": "10 km"}',)}
RESULTS = ("3", "42", '{"temp": 18}', "18°C ☀", "", "[]", "error: timeout")
TOOLS = (ADD, WEATHER, SEARCH, CONVERT)


def generated_corpus(seed: int = 0, size: int = 300) -> tuple[ProbeConversation, ...]:
    """`size` conversations named `corpus_NNN`, the same for the same seed."""
    rng = random.Random(seed)
    return tuple(_conversation(rng, f"corpus_{i:03d}") for i in range(size))


def _conversation(rng: random.Random, name: str) -> ProbeConversation:
    # A quarter are plain chat (no tools, no reasoning, thinking off): the only kind a template
    # without those slots (chatml) can compare, so it gets a corpus of its own size too.
    plain = rng.random() < 0.25
    tools = rng.sample(TOOLS, rng.randint(1, 3)) if not plain and rng.random() < 0.6 else None
    msgs: list[dict] = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": rng.choice(("You are a terse assistant.", "", "Réponds en français."))})
    calls = [0]                                   # the conversation's running count of tool calls
    for _ in range(rng.randint(1, 4)):            # finished episodes: history
        if tools and rng.random() < 0.45:
            _tool_loop(rng, msgs, tools, calls, close=True)
        else:
            _plain(rng, msgs, plain)
    end = rng.random()
    if tools and end < 0.3:                        # a live tool loop: the model answers its results
        _tool_loop(rng, msgs, tools, calls, close=False)
    elif end < 0.92:
        msgs.append({"role": "user", "content": _user_text(rng)})
    # else: the conversation ends with the assistant's reply (generation prompt after it)
    return ProbeConversation(name, msgs, tools, not plain and rng.random() < 0.6)


def _user_text(rng: random.Random) -> str | None:
    r = rng.random()
    return "" if r < 0.05 else None if r < 0.08 else rng.choice(TEXTS)


def _assistant(rng: random.Random, content: str | None, plain: bool = False) -> dict:
    m: dict = {"role": "assistant", "content": content}
    r = 1.0 if plain else rng.random()
    if r < 0.55:
        m["reasoning_content"] = rng.choice(REASONING)
    elif r < 0.62:
        m["reasoning_content"] = ""
    return m


def _plain(rng: random.Random, msgs: list[dict], plain: bool) -> None:
    msgs.append({"role": "user", "content": _user_text(rng)})
    content = rng.choice(REPLIES) if rng.random() < 0.9 else rng.choice(("", None))
    msgs.append(_assistant(rng, content, plain))


def _tool_loop(rng: random.Random, msgs: list[dict], tools: list[dict], calls: list[int], *, close: bool) -> None:
    msgs.append({"role": "user", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 2)):            # rounds of calls before the final answer
        fns = [rng.choice(tools)["function"]["name"] for _ in range(rng.choice((1, 1, 2, 3)))]
        batch = []
        for fn in fns:
            batch.append({"id": f"functions.{fn}:{calls[0]}", "type": "function",
                          "function": {"name": fn, "arguments": rng.choice(ARGS[fn])}})
            calls[0] += 1
        content = rng.choice(("", "", None, "Calling the tool."))
        msgs.append({**_assistant(rng, content), "tool_calls": batch})
        for tc in batch:
            result = {"role": "tool", "tool_call_id": tc["id"], "content": rng.choice(RESULTS)}
            if rng.random() < 0.3:
                result["name"] = tc["function"]["name"]
            msgs.append(result)
    if close:
        msgs.append(_assistant(rng, rng.choice(REPLIES)))


def corpus_summary(corpus: tuple[ProbeConversation, ...]) -> dict[str, int]:
    """What the corpus covers, counted (docs/templates.md quotes these for seed 0)."""
    def plain_with_reasoning(p):
        return sum(m["role"] == "assistant" and not m.get("tool_calls") and bool(m.get("reasoning_content"))
                   for m in p.messages)
    return {
        "conversations": len(corpus),
        "thinking_off": sum(not p.thinking for p in corpus),
        "with_tools": sum(bool(p.tools) for p in corpus),
        "parallel_calls": sum(any(len(m.get("tool_calls") or ()) > 1 for m in p.messages) for p in corpus),
        "tool_loop_after_plain_turn": sum(_loop_after_plain(p.messages) for p in corpus),
        "two_plain_replies_with_reasoning": sum(plain_with_reasoning(p) >= 2 for p in corpus),
        "none_content": sum(any(m.get("content") is None for m in p.messages) for p in corpus),
        "empty_content": sum(any(m.get("content") == "" for m in p.messages) for p in corpus),
        "non_ascii": sum(not json.dumps(p.messages, ensure_ascii=False).isascii() for p in corpus),
    }


def _loop_after_plain(messages: list[dict]) -> bool:
    seen_plain = False
    for m in messages:
        if m["role"] == "assistant" and not m.get("tool_calls"):
            seen_plain = True
        elif m["role"] == "assistant" and seen_plain:
            return True
    return False
