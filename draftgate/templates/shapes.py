"""Conversation shapes: the features chat templates branch on, and a corpus that holds every one.

The fixed probes and the seeded corpus are examples: a template edit that only shows on a shape
neither holds (a `name` on a user turn, a conversation opening with an assistant turn, consecutive
user turns) passed the contract while the prompts stage admitted that shape. So the shapes are
derived from the prompts stage's rules (prompts/: which roles, where; which keys per role, schema.MESSAGE_KEYS) and
`covering_corpus()` is built to hold each feature in each serving mode, by construction.

A message's kind: system | user | assistant (no tool calls) | calls (an assistant turn with tool
calls) | tool. Features, by family:
- order: `first:KIND`, `turn:A>B` (every admitted pair of neighbours), `last:user|tool` (the
  prompts stage drops a final assistant turn);
- fields: `name:KIND:text|empty` on every kind whose role may carry a name (schema.MESSAGE_KEYS),
  `calls_content:none|text` (null and "" are both stored as null beside tool calls);
- tools: `tools:absent|one|several` (an empty list is stored as absent);
- calls: `calls:one|several` per assistant turn;
- reasoning: `reasoning:KIND:present|empty|absent:WHERE:REL`: on a plain or calls turn, WHERE
  `history` (before the last user turn) or `loop` (after it: Qwen3 keeps reasoning there), REL
  `before` / `last` / `after` the last plain assistant reply (Kimi keeps reasoning after it);
- text: content that a template inspects: an assistant content opening with "\\n" (Qwen3 strips
  it in the loop), holding "</think>" (Qwen3 splits on it), a user content wrapped in
  <tool_response> (Qwen3 does not count it as a query), alone and after a query and an assistant
  turn with reasoning (there it decides whether that reasoning is kept).
The serving mode (thinking on or off) is the other axis: coverage is counted per (feature, mode).

How a feature is counted (contract.py `shape_coverage`; gate_template again, reading each probe's
stored conversation with its own reader, draftgate/checks/template.py, never these labels):
in a mode, a feature is held by the conversations of that mode that have it; admitted when the code
template renders at least one of them (the prompts stage renders every prompt with the same code
template and rejects what it refuses: template_unsupported); compared when the official template
rendered one of those too. Every (feature, mode) must be held; an admitted one must be compared.
The covering corpus takes, for each (feature, mode), the simplest conversation that has it (fewest
tool-call turns, then fewest messages, one field changed from the plainest), so a feature is not
hidden behind another the template refuses.
"""

from __future__ import annotations

import itertools
from typing import Iterator

from draftgate.schema import MESSAGE_KEYS
from draftgate.templates.probes import ADD, WEATHER, ProbeConversation

MODES = (True, False)
KINDS = ("system", "user", "assistant", "calls", "tool")
_ROLE = {"system": "system", "user": "user", "assistant": "assistant", "calls": "assistant", "tool": "tool"}
STATES = ("present", "empty", "absent")
_NEXT = ("user", "assistant", "calls", "tool")    # what may follow a turn (system only opens)


def _catalogue() -> tuple[tuple[str, str], ...]:
    named = [k for k in KINDS if "name" in MESSAGE_KEYS[_ROLE[k]]]
    reasoning = [(k, where, rel) for k in ("assistant", "calls") for where in ("history", "loop")
                 for rel in (("before", "last") if k == "assistant" else ("before", "after"))]
    return (
        *((f"first:{k}", "order") for k in ("system", "user", "assistant", "calls")),
        *((f"turn:{a}>{b}", "order") for a in KINDS for b in _NEXT if not (a == "system" and b == "tool")),
        *((f"last:{k}", "order") for k in ("user", "tool")),
        *((f"name:{k}:{v}", "fields") for k in named for v in ("text", "empty")),
        *((f"calls_content:{v}", "fields") for v in ("none", "text")),
        *((f"tools:{v}", "tools") for v in ("absent", "one", "several")),
        *((f"calls:{v}", "calls") for v in ("one", "several")),
        *((f"reasoning:{k}:{s}:{w}:{r}", "reasoning") for k, w, r in reasoning for s in STATES),
        *((f"text:{v}", "text") for v in ("assistant_leading_newline", "assistant_think_markup",
                                          "user_tool_response_wrapped", "user_tool_response_wrapped_after_reasoning")),
    )


# (feature, family), in a stable order: contract.json carries it for gate_template.
FEATURES: tuple[tuple[str, str], ...] = _catalogue()
FEATURE_NAMES = frozenset(f for f, _ in FEATURES)


def kind_of(m: dict) -> str:
    return "calls" if m.get("role") == "assistant" and m.get("tool_calls") else str(m.get("role"))


def shape_features(messages: list, tools: list | None) -> tuple[str, ...]:
    """The catalogue features a conversation has (any conversation: a probe that is not an
    admitted prompt just has fewer of them)."""
    msgs = [m for m in messages if isinstance(m, dict)]
    kinds = [kind_of(m) for m in msgs]
    out = {f"tools:{'absent' if not tools else 'one' if len(tools) == 1 else 'several'}"}
    if kinds:
        out.add(f"first:{kinds[0]}")
        out.add(f"last:{kinds[-1]}")
    out.update(f"turn:{a}>{b}" for a, b in zip(kinds, kinds[1:]))
    last_user = max((i for i, k in enumerate(kinds) if k == "user"), default=-1)
    last_plain = max((i for i, k in enumerate(kinds) if k == "assistant"), default=-1)
    queried = reasoned = False       # a real user query came before; an assistant turn with reasoning after it
    for i, (m, k) in enumerate(zip(msgs, kinds)):
        content = m.get("content")
        if "name" in m:
            out.add(f"name:{k}:{'text' if m['name'] else 'empty'}")
        if k == "user" and isinstance(content, str) and content.startswith("<tool_response>") \
                and content.endswith("</tool_response>"):
            out.add("text:user_tool_response_wrapped")
            if reasoned:
                out.add("text:user_tool_response_wrapped_after_reasoning")
        elif k == "user":
            queried = True
        if k not in ("assistant", "calls"):
            continue
        if isinstance(content, str) and content.startswith("\n"):
            out.add("text:assistant_leading_newline")
        if isinstance(content, str) and "</think>" in content:
            out.add("text:assistant_think_markup")
        if k == "calls":
            out.add(f"calls:{'one' if len(m['tool_calls']) == 1 else 'several'}")
            out.add(f"calls_content:{'text' if content else 'none'}")
        r = m.get("reasoning_content")
        state = "absent" if r is None else "present" if r else "empty"
        reasoned = reasoned or (queried and state == "present")
        where = "history" if i < last_user else "loop"
        rel = "before" if i < last_plain else "last" if i == last_plain else "after"
        out.add(f"reasoning:{k}:{state}:{where}:{rel}")
    return tuple(sorted(out & FEATURE_NAMES))


# ---------------------------------------------------------------- the covering corpus

USER, REPLY, CALL_TEXT, RESULT = "What is 2+2?", "4", "Calling the tool.", "42"
SYSTEM = "You are a terse assistant."
# One change from the plainest message of a kind: (kinds it applies to, label, change).
VARIATIONS = (
    (("system", "user", "assistant", "calls", "tool"), "name", lambda m: m.update(name="Ada")),
    (("system", "user", "assistant", "calls", "tool"), "name_empty", lambda m: m.update(name="")),
    (("assistant", "calls"), "reasoning", lambda m: m.update(reasoning_content="Think it through.")),
    (("assistant", "calls"), "reasoning_empty", lambda m: m.update(reasoning_content="")),
    (("calls",), "content", lambda m: m.update(content=CALL_TEXT)),
    (("calls",), "parallel", None),                  # built in _conversation: a second call
    (("assistant",), "leading_newline", lambda m: m.update(content="\n\n" + REPLY)),
    (("assistant",), "think_markup", lambda m: m.update(content="Thought.</think>\n\n" + REPLY)),
    (("user",), "tool_response_wrapped", lambda m: m.update(content="<tool_response>\n3\n</tool_response>")),
)


def admitted_sequences(max_len: int = 5) -> Iterator[tuple[str, ...]]:
    """Kind sequences the prompts stage admits (prompts.normalise): a system turn only first, a
    user turn somewhere, a tool turn only after some tool-call turn, ending with user or tool;
    ordered simplest first (fewest tool-call turns, then length)."""
    found = []
    for n in range(1, max_len + 1):
        for seq in itertools.product(KINDS, repeat=n):
            if "system" in seq[1:] or "user" not in seq or seq[-1] not in ("user", "tool"):
                continue
            if any(k == "tool" and "calls" not in seq[:i] for i, k in enumerate(seq)):
                continue
            found.append(seq)
    return iter(sorted(found, key=lambda s: (s.count("calls"), len(s))))


def _conversation(seq: tuple[str, ...], changes: tuple[tuple[int, str], ...] = ()) -> list[dict]:
    msgs: list[dict] = []
    pending: list[str] = []          # calls not yet answered, oldest first
    answered: list[str] = []
    n_calls = 0
    for i, k in enumerate(seq):
        if k == "system":
            m = {"role": "system", "content": SYSTEM}
        elif k == "user":
            m = {"role": "user", "content": USER}
        elif k == "assistant":
            m = {"role": "assistant", "content": REPLY}
        elif k == "calls":
            calls = []
            for _ in range(2 if (i, "parallel") in changes else 1):
                cid = f"functions.add:{n_calls}"
                calls.append({"id": cid, "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}})
                pending.append(cid)
                n_calls += 1
            m = {"role": "assistant", "content": None, "tool_calls": calls}
        else:
            # A result answers the oldest open call; with none open (admitted: ids need only have
            # been called before), the latest call again.
            cid = pending.pop(0) if pending else answered[-1]
            answered.append(cid)
            m = {"role": "tool", "tool_call_id": cid, "content": RESULT}
        for at, label in changes:
            if at == i and label != "parallel":
                next(change for kinds, name, change in VARIATIONS if name == label)(m)
        msgs.append(m)
    return msgs


def _candidates() -> Iterator[tuple[list[dict], list | None]]:
    # One change from the plainest conversation of each sequence first, then two: a feature that
    # is a combination (a wrapped user turn after reasoning) needs two.
    seqs = list(admitted_sequences())
    for seq in seqs:
        yield _conversation(seq), None
        for change in _changes(seq):
            yield _conversation(seq, (change,)), None
        yield _conversation(seq), [ADD]
        yield _conversation(seq), [ADD, WEATHER]
    for seq in seqs:
        for pair in itertools.combinations(_changes(seq), 2):
            if pair[0][0] != pair[1][0]:
                yield _conversation(seq, pair), None


def _changes(seq: tuple[str, ...]) -> list[tuple[int, str]]:
    return [(i, label) for i, k in enumerate(seq) for kinds, label, _ in VARIATIONS if k in kinds]


def covering_corpus() -> tuple[ProbeConversation, ...]:
    """For each mode, the simplest conversation for each catalogue feature (about 55 per mode),
    named `shape_NNN` and the same on every call."""
    out: list[ProbeConversation] = []
    for thinking in MODES:
        missing = set(FEATURE_NAMES)
        for messages, tools in _candidates():
            have = set(shape_features(messages, tools))
            if have & missing:
                out.append(ProbeConversation(f"shape_{len(out):03d}", messages, tools, thinking))
                missing -= have
            if not missing:
                break
        if missing:   # a catalogue feature no admitted sequence can hold: the catalogue is wrong
            raise AssertionError(f"covering_corpus: no admitted conversation has {sorted(missing)}")
    return tuple(out)
