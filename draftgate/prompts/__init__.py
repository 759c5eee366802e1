"""Prompt ingestion: raw chat records -> normalised prompts with stable ids and a split.

Records come as OpenAI `messages` or ShareGPT `conversations` (JSONL lines or Parquet rows).
Each becomes an OpenAI-shape conversation that ends where the model must answer, or a reject
with a reason code, its `file:line` and the fix. The core is pure (a record in, a decision out);
only `raw_files` and `read_raw` touch disk. The run over all records (first occurrence wins, the
cap, the split, the two tables) is `stream.ingest_to_files`, in bounded memory.

The package: this module (records, decisions, ids, split; the public names), stream.py (the run
in bounded memory), contamination.py (held-out near-duplicates), run.py (the stage's work).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from draftgate.config import PromptsParams
from draftgate.io import text_sha256
from draftgate.schema import MESSAGE_KEYS, compact_json

REASONS = (
    "invalid_utf8", "invalid_json", "not_an_object", "no_messages", "no_user_turn",
    "unknown_role", "empty_content", "bad_message", "bad_tools", "bad_tool_schema", "bad_mode",
)
# Decided by decide() with the target's template and tokenizer, not by a record alone.
TEMPLATE_UNSUPPORTED = "template_unsupported"
TOO_LONG = "too_long"          # the rendered prompt leaves no room for generate.max_tokens
ROLES = ("system", "user", "assistant", "tool")
# ShareGPT speaker names -> OpenAI roles; function_call/observation carry tool calls/results.
SHAREGPT_ROLES = {
    "system": "system", "human": "user", "user": "user", "gpt": "assistant",
    "assistant": "assistant", "function_call": "assistant", "tool": "tool", "observation": "tool",
}
RECORD_CHARS = 1000  # raw record kept in a reject row, for review


class Rejected(Exception):
    def __init__(self, reason: str, detail: str):
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class RawRecord:
    file: str            # name relative to the raw directory; its stem is the dataset
    index: int           # 1-based line (JSONL) or 0-based row (Parquet)
    data: bytes | dict   # the line's bytes, or the row as a dict

    @property
    def source(self) -> str:
        return f"{self.file}:{self.index}" if isinstance(self.data, bytes) else f"{self.file}:row {self.index}"


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    dataset: str
    messages: str             # compact JSON text, OpenAI shape, record's key order
    tools: str | None         # compact JSON text, or None
    source: str
    dropped_final_assistant: bool
    # The serving mode the prompt is rendered and generated in: the record's own "thinking"
    # field (None: absent, the dataset's or the template's setting applies; `in_mode` sets it).
    thinking: bool | None = None

    def in_mode(self, thinking: bool) -> "Prompt":
        """This prompt served with thinking on or off: its id hashes the switch when on."""
        import dataclasses

        messages, tools = json.loads(self.messages), json.loads(self.tools) if self.tools else None
        return dataclasses.replace(self, prompt_id=prompt_id_of(messages, tools, thinking), thinking=thinking)


@dataclass(frozen=True)
class Reject:
    source: str
    reason: str
    detail: str
    record: str


@dataclass
class Tally:
    """What the stage metrics report, counted as rows are decided."""
    rows_in: int = 0
    blank_lines: int = 0
    n_duplicates: int = 0
    n_capped: int = 0
    rows_out: int = 0
    rejects_by_reason: Counter = field(default_factory=Counter)
    rejects_by_dataset: Counter = field(default_factory=Counter)
    per_dataset_in: Counter = field(default_factory=Counter)
    out_by_dataset: Counter = field(default_factory=Counter)
    splits: Counter = field(default_factory=Counter)
    with_tools: int = 0
    final_assistant_dropped: int = 0
    by_mode: Counter = field(default_factory=Counter)     # kept prompts per serving mode (config.mode_name)

    def reject(self, r: Reject) -> None:
        self.rejects_by_reason[r.reason] += 1
        self.rejects_by_dataset[Path(r.source.split(":")[0]).stem] += 1

    def keep(self, dataset: str, split: str, with_tools: bool, dropped_final_assistant: bool,
             thinking: bool = False) -> None:
        from draftgate.config import mode_name

        self.by_mode[mode_name(thinking, with_tools)] += 1
        self.rows_out += 1
        self.out_by_dataset[dataset] += 1
        self.splits[split] += 1
        self.with_tools += with_tools
        self.final_assistant_dropped += dropped_final_assistant


# ---------------------------------------------------------------- ids and split

def canonical_json(obj: Any) -> str:
    # Text is hashed as given (no NFC, no stripping): the same bytes reach the API.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def prompt_id_of(messages: list[dict], tools: list[dict] | None, thinking: bool = False) -> str:
    # The id names the request: the thinking switch, when on, is part of it (one conversation
    # served both ways is two prompts). Off adds nothing, so a template without a switch (ChatML)
    # keeps the ids it always had; the split hashes the conversation alone (conversation_id).
    doc: dict[str, Any] = {"messages": messages, "tools": tools}
    if thinking:
        doc["thinking"] = True
    return text_sha256(canonical_json(doc))


def conversation_id(messages: list[dict], tools: list[dict] | None) -> str:
    """What the split hashes (split_by: prompt): the conversation whatever its serving mode, so
    both modes of one prompt land on one side."""
    return prompt_id_of(messages, tools, False)


def split_of(prompt_id: str, seed: int, heldout_fraction: float) -> str:
    # A hash of id and seed, not a shuffle: a prompt keeps its split whatever else is in the run.
    digest = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "heldout" if u < heldout_fraction else "train"


# ---------------------------------------------------------------- one record

def process(record: RawRecord) -> Prompt | Reject | None:
    """One raw record -> a Prompt, a Reject, or None for a blank JSONL line."""
    if isinstance(record.data, bytes) and not record.data.strip():
        return None
    try:
        obj = decode_line(record.data, record.index == 1) if isinstance(record.data, bytes) else record.data
        messages, tools, dropped = normalise(obj)
        thinking = _thinking(obj)
        text_messages = compact_json(messages)
        text_tools = None if tools is None else compact_json(tools)
        _check_encodable(text_messages, text_tools)
    except Rejected as e:
        return Reject(record.source, e.reason, e.detail, _truncate(record.data))
    except RecursionError:
        return Reject(record.source, "invalid_json", "nested deeper than the JSON parser allows; flatten the record",
                      _truncate(record.data))
    return Prompt(prompt_id_of(messages, tools, bool(thinking)), Path(record.file).stem, text_messages, text_tools,
                  record.source, dropped, thinking)


def _thinking(obj: Any) -> bool | None:
    if not isinstance(obj, dict) or obj.get("thinking") is None:
        return None
    if not isinstance(obj["thinking"], bool):
        raise Rejected("bad_mode", f"'thinking' is {obj['thinking']!r}; it must be true or false (the serving "
                                   "mode of this prompt), or left out for the dataset's (prompts.thinking)")
    return obj["thinking"]


def decode_line(raw: bytes, first_line: bool = False) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Rejected("invalid_utf8", f"byte {e.start} is not UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
    if first_line:
        text = text.removeprefix("\ufeff")  # a BOM is file framing, not content
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (json.JSONDecodeError, ValueError) as e:
        raise Rejected("invalid_json", f"{e}; each line must hold one complete JSON object") from None


def normalise(obj: Any) -> tuple[list[dict], list[dict] | None, bool]:
    """A record -> (OpenAI messages ending where the model answers, tools or None, final assistant dropped)."""
    if not isinstance(obj, dict):
        raise Rejected("not_an_object", f"got a JSON {_type(obj)}; each record must be an object with 'messages'")
    has_m, has_c = _present(obj, "messages"), _present(obj, "conversations")
    if has_m and has_c:
        raise Rejected("bad_message", "both 'messages' and 'conversations' are set; keep one")
    if not (has_m or has_c):
        raise Rejected("no_messages", "no 'messages' (OpenAI) or 'conversations' (ShareGPT) key; add one")
    key = "messages" if has_m else "conversations"
    turns = _maybe_json(obj[key], key, "bad_message")
    _check_json_values(turns, key, lambda path: "bad_message")
    if not isinstance(turns, list):
        raise Rejected("bad_message", f"'{key}' is a {_type(turns)}; it must be a list of turns")
    if not turns:
        raise Rejected("no_messages", f"'{key}' is empty; add at least one user turn")
    messages = [_openai_message(m, i) for i, m in enumerate(turns)] if has_m else _from_sharegpt(turns)
    system = obj.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise Rejected("bad_message", f"top-level 'system' is a {_type(system)}; it must be a string")
        if system.strip():
            if messages[0]["role"] == "system":
                raise Rejected("bad_message", "a top-level 'system' and a system turn; keep one")
            messages.insert(0, {"role": "system", "content": system})
    tools = _tools(obj.get("tools"))
    _check_order(messages)
    dropped = messages[-1]["role"] == "assistant"
    if dropped:
        messages.pop()  # the answer is regenerated by the target model
    if not any(m["role"] == "user" for m in messages):
        raise Rejected("no_user_turn", "no user turn; a prompt needs a user message for the model to answer")
    if messages[-1]["role"] not in ("user", "tool"):
        raise Rejected("bad_message", f"after dropping the final assistant turn the prompt ends with "
                                      f"'{messages[-1]['role']}'; it must end with a user or tool turn")
    return messages, tools, dropped


# ---------------------------------------------------------------- OpenAI shape

def _openai_message(m: Any, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise Rejected("bad_message", f"{where} is a {_type(m)}; each message must be an object with 'role' and 'content'")
    role = m.get("role")
    if not isinstance(role, str):
        raise Rejected("bad_message", f"{where}.role is {_type(role)}; it must be one of {', '.join(ROLES)}")
    if role not in ROLES:
        raise Rejected("unknown_role", f"{where}.role {role!r} is not one of {', '.join(ROLES)}; map it to one of them")
    extra = sorted(k for k, v in m.items() if v is not None and k not in MESSAGE_KEYS[role])
    if extra:
        raise Rejected("bad_message", f"{where} ({role}) has unexpected key {extra[0]!r}; "
                                      f"allowed: {', '.join(sorted(MESSAGE_KEYS[role]))}")
    calls = None if m.get("tool_calls") is None else _tool_calls(m["tool_calls"], where)
    out: dict[str, Any] = {"role": role, "content": _content(m.get("content"), role, where, has_calls=calls is not None)}
    if calls is not None:
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name", "reasoning_content"):
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                raise Rejected("bad_message", f"{where}.{key} is a {_type(m[key])}; it must be a string")
            out[key] = m[key]
    if role == "tool" and "tool_call_id" not in out:
        raise Rejected("bad_message", f"{where} (tool) has no tool_call_id; set it to the id of the call it answers")
    return out


def _content(content: Any, role: str, where: str, has_calls: bool) -> str | None:
    if content is None or content == "":
        if has_calls:
            return None  # an assistant turn that only calls tools: null and "" mean the same
        raise Rejected("empty_content", f"{where} ({role}) has no content; give it text or drop the turn")
    if not isinstance(content, str):
        raise Rejected("bad_message", f"{where}.content is a {_type(content)}; it must be a string "
                                      "(join text parts into one string)")
    if not content.strip():
        raise Rejected("empty_content", f"{where} ({role}) content is only whitespace; give it text or drop the turn")
    return content


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list) or not calls:
        raise Rejected("bad_message", f"{where}.tool_calls must be a non-empty list, got {_type(calls)}")
    out = []
    for k, c in enumerate(calls):
        at = f"{where}.tool_calls[{k}]"
        if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
            raise Rejected("bad_message", f"{at} must be an object with 'id', 'type' and 'function'")
        extra = sorted(key for key, v in c.items() if v is not None and key not in ("id", "type", "function"))
        if extra:
            raise Rejected("bad_message", f"{at} has unexpected key {extra[0]!r}; allowed: function, id, type")
        if c.get("type", "function") != "function":
            raise Rejected("bad_message", f"{at}.type is {c.get('type')!r}; only 'function' is supported")
        if not isinstance(c.get("id"), str) or not c["id"]:
            raise Rejected("bad_message", f"{at}.id is missing; give each call an id that its tool result names")
        fn = c["function"]
        name, args = fn.get("name"), fn.get("arguments")
        if not isinstance(name, str) or not name:
            raise Rejected("bad_message", f"{at}.function.name must be a non-empty string")
        extra = sorted(key for key, v in fn.items() if v is not None and key not in ("name", "arguments"))
        if extra:
            raise Rejected("bad_message", f"{at}.function has unexpected key {extra[0]!r}; allowed: arguments, name")
        out.append({"id": c["id"], "type": "function", "function": {"name": name, "arguments": _arguments(args, at)}})
    return out


def _arguments(args: Any, at: str) -> str:
    # Kept as the verbatim string received: re-serialising would change the bytes the model saw.
    if not isinstance(args, str):
        raise Rejected("bad_message", f"{at}.function.arguments is a {_type(args)}; it must be a JSON string "
                                      "(OpenAI shape), e.g. \"{\\\"city\\\": \\\"Oslo\\\"}\"")
    try:
        json.loads(args, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as e:
        raise Rejected("bad_message", f"{at}.function.arguments is not valid JSON ({e}); fix the string") from None
    return args


# ---------------------------------------------------------------- ShareGPT shape

def _from_sharegpt(turns: list) -> list[dict]:
    messages: list[dict] = []
    pending: list[str] = []   # call ids awaiting an observation, in order
    n_calls = 0
    for i, t in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(t, dict):
            raise Rejected("bad_message", f"{where} is a {_type(t)}; each turn must be an object with 'from' and 'value'")
        extra = sorted(k for k, v in t.items() if v is not None and k not in ("from", "value"))
        if extra:
            raise Rejected("bad_message", f"{where} has unexpected key {extra[0]!r}; allowed: from, value")
        who = t.get("from")
        if not isinstance(who, str):
            raise Rejected("bad_message", f"{where}.from is {_type(who)}; it must be one of {', '.join(SHAREGPT_ROLES)}")
        if who not in SHAREGPT_ROLES:
            raise Rejected("unknown_role", f"{where}.from {who!r} is not one of {', '.join(SHAREGPT_ROLES)}; map it")
        role, value = SHAREGPT_ROLES[who], t.get("value")
        if who == "function_call":
            calls = _sharegpt_calls(value, where, n_calls)
            n_calls += len(calls)
            pending.extend(c["id"] for c in calls)
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        elif role == "tool":
            if not pending:
                raise Rejected("bad_message", f"{where} ({who}) answers no function_call; put a function_call turn before it")
            messages.append({"role": "tool", "content": _content(value, role, where + ".value", has_calls=False),
                             "tool_call_id": pending.pop(0)})
        else:
            messages.append({"role": role, "content": _content(value, role, where + ".value", has_calls=False)})
    return messages


def _sharegpt_calls(value: Any, where: str, first: int) -> list[dict]:
    # LLaMA-Factory style: value is JSON text of {"name", "arguments"} or a list of them.
    parsed = _maybe_json(value, where + ".value", "bad_message")
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = []
    for k, item in enumerate(items):
        at = f"{where}.value[{k}]" if isinstance(parsed, list) else f"{where}.value"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise Rejected("bad_message", f"{at} must be a call {{\"name\": ..., \"arguments\": ...}}")
        args = item.get("arguments", {})
        if not isinstance(args, str):
            # The dataset stored parsed arguments; this is prompt history, so serialise it the way
            # chat templates do (`tojson`: ", " and ": " separators, non-ASCII kept).
            args = json.dumps(args, ensure_ascii=False, allow_nan=False)
        # Ids are positional so the OpenAI form of the same conversation can carry the same ones.
        calls.append({"id": f"call_{first + k}", "type": "function",
                      "function": {"name": item["name"], "arguments": _arguments(args, at)}})
    return calls


# ---------------------------------------------------------------- tools and turn order

def _tools(value: Any) -> list[dict] | None:
    if value is None or isinstance(value, str) and not value.strip():
        return None  # LLaMA-Factory ShareGPT files write "tools": "" for no tools
    tools = _maybe_json(value, "tools", "bad_tools")
    _check_json_values(tools, "tools", lambda path: "bad_tool_schema" if ".parameters" in path else "bad_tools")
    if not isinstance(tools, list):
        raise Rejected("bad_tools", f"'tools' is a {_type(tools)}; it must be a list of tool definitions")
    if not tools:
        return None  # no tools and an empty list render the same prompt
    out, names = [], set()
    for k, t in enumerate(tools):
        at = f"tools[{k}]"
        if isinstance(t, dict) and "type" in t:
            if t["type"] != "function" or not isinstance(t.get("function"), dict):
                raise Rejected("bad_tools", f"{at} must be {{\"type\": \"function\", \"function\": {{...}}}}")
            tool = t
        elif isinstance(t, dict) and "name" in t:
            tool = {"type": "function", "function": t}  # bare glaive/xlam definition
        else:
            raise Rejected("bad_tools", f"{at} is not a tool definition; use {{\"type\": \"function\", "
                                        "\"function\": {\"name\", \"description\", \"parameters\"}}")
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise Rejected("bad_tools", f"{at}.function.name must be a non-empty string")
        if name in names:
            raise Rejected("bad_tools", f"{at}: tool {name!r} is defined twice; keep one definition")
        names.add(name)
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise Rejected("bad_tools", f"{at}.function.description must be a string")
        if "parameters" in fn:
            _check_parameters(fn["parameters"], f"{at}.function.parameters")
        out.append(tool)
    return out


def _check_parameters(schema: Any, at: str) -> None:
    if not isinstance(schema, dict):
        raise Rejected("bad_tool_schema", f"{at} is a {_type(schema)}; it must be a JSON Schema object")
    if schema.get("type", "object") != "object":
        raise Rejected("bad_tool_schema", f"{at}.type is {schema['type']!r}; tool parameters must be type 'object'")
    if not isinstance(schema.get("$schema", ""), str):
        raise Rejected("bad_tool_schema", f"{at}['$schema'] must be a meta-schema URI string")
    problem = _schema_problem(canonical_json(schema))
    if problem:
        raise Rejected("bad_tool_schema", f"{at}{problem}")


@functools.lru_cache(maxsize=8192)
def _schema_problem(schema_json: str) -> str | None:
    # Checking against the meta-schema is ~3 ms and dominates ingestion; datasets repeat the
    # same few hundred tool schemas, so each distinct one is checked once (30k records: 19 s -> 2.7 s).
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    schema = json.loads(schema_json)
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as e:
        return "".join(f"[{p!r}]" for p in e.path) + f" is not valid JSON Schema: {e.message}"
    return None


def _check_order(messages: list[dict]) -> None:
    ids: set[str] = set()
    for i, m in enumerate(messages):
        if m["role"] == "system" and i > 0:
            raise Rejected("bad_message", f"messages[{i}] is a system turn; only the first message may be system")
        for c in m.get("tool_calls", ()):
            if c["id"] in ids:
                raise Rejected("bad_message", f"messages[{i}]: tool call id {c['id']!r} is used twice; make ids unique")
            ids.add(c["id"])
        if m["role"] == "tool" and m["tool_call_id"] not in ids:
            raise Rejected("bad_message", f"messages[{i}] (tool) answers {m['tool_call_id']!r}, which no earlier "
                                          "assistant tool call has; fix tool_call_id")


# ---------------------------------------------------------------- the whole run

Problem = Callable[[list[dict], list[dict] | None, bool], "str | tuple[str, str] | None"]


def decide(record: RawRecord, render_problem: Problem | None,
           modes: Callable[[str], tuple[bool, ...]] = lambda dataset: (False,)) -> list[Prompt | Reject] | None:
    """`process`, then each serving mode, then the target template's verdict on each: the
    prompts (one per mode), a reject, or None (blank line).

    `modes(dataset)`: the thinking settings a record of that dataset is served in when it names
    none itself (prompts.thinking, else template.thinking; both: (True, False)).
    `render_problem(messages, tools, thinking)` says why the target's chat template cannot render a prompt
    (a detail: template_unsupported), or (reason, detail) for another target-side reason (too_long);
    None when it can: such a prompt could never become exact training data, so it is rejected
    here, before any request is paid for.
    """
    out = process(record)
    if not isinstance(out, Prompt):
        return None if out is None else [out]
    wanted = (out.thinking,) if out.thinking is not None else modes(out.dataset)
    decided: list[Prompt | Reject] = []
    for thinking in wanted:
        p = out if out.thinking is not None else out.in_mode(thinking)
        problem = None
        if render_problem is not None:
            problem = render_problem(json.loads(p.messages), json.loads(p.tools) if p.tools else None, thinking)
        if problem is not None:
            reason, detail = problem if isinstance(problem, tuple) else (TEMPLATE_UNSUPPORTED, problem)
            assert reason in (TEMPLATE_UNSUPPORTED, TOO_LONG), reason
            return [Reject(p.source, reason, detail, _truncate(p.messages.encode("utf-8")))]
        decided.append(p)
    return decided


# ---------------------------------------------------------------- the target's context

@dataclass(frozen=True)
class LengthLimit:
    """The longest prompt the target can answer: its context less generate.max_tokens."""
    max_prompt_tokens: int | None   # None: the context is unknown, no prompt is measured
    context: int | None
    source: str                     # where the context came from, for the metrics and the errors


def length_limit(context_tokens: int | None, declared: Any, max_tokens: int, model_dir: str | None = None
                 ) -> LengthLimit:
    """From prompts.context_tokens; else the model directory's config.json (max_position_embeddings,
    what vLLM and SGLang take as the longest sequence; text_config's for a multimodal model); else
    the tokenizer's declared `model_max_length` (transformers puts 1e30 there when the tokenizer
    declares none: anything past MAX_CONTEXT counts as none)."""
    from draftgate.config import MAX_CONTEXT

    def real(n: Any) -> bool:
        return isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_CONTEXT

    configured = _config_context(model_dir) if model_dir else None
    if context_tokens is not None:
        context, source = context_tokens, "prompts.context_tokens"
    elif real(configured):
        context, source = configured, f"max_position_embeddings of {model_dir}/config.json"
    elif real(declared):
        context, source = declared, "the tokenizer's model_max_length"
    else:
        return LengthLimit(None, None, "none: the target declares no context; set prompts.context_tokens")
    if max_tokens >= context:
        raise ValueError(f"generate.max_tokens {max_tokens} leaves no room for a prompt in the target's context "
                         f"of {context} tokens ({source}); lower generate.max_tokens")
    return LengthLimit(context - max_tokens, context, source)


def _config_context(model_dir: str) -> Any:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None    # a tokenizer-only directory: its tokenizer's declaration is all there is
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return config.get("max_position_embeddings", text.get("max_position_embeddings"))


# Most prompts are never encoded. A token spans at least one byte of normalised text (byte-level
# BPE; SentencePiece's byte fallback), so a prompt whose bytes are within a quarter of the limit
# fits (the factor covers normalisation that grows text, NFC at most 3x, and an added prefix
# space). A token spans at most the tokenizer's widest token, so a prompt of more than three
# times that many bytes per allowed token is too long (NFC shrinks text at most 3x: three Hangul
# jamo, 9 bytes, compose into one 3-byte syllable): a 10 MB message is refused without being
# encoded (encoded, it took 32 s and 1.4 GB for SmolLM2's 2.3M tokens; refused so, the stage
# ran in 13.5 s at 218 MB, most of it the stage's own start).
UNMEASURED_BYTES_FACTOR = 4
SHRINK_FACTOR = 3


def widest_token(tok: Any) -> int | None:
    """Bytes of the tokenizer's longest token, or None when its pieces are not byte-level."""
    from draftgate.tokenizers import TokenizerError

    try:
        return max(len(tok.token_bytes(i)) for i in range(tok.vocab_size))
    except TokenizerError:
        return None


def too_long(limit: LengthLimit, encode: Callable[[Any], list[int]], template_name: str,
             max_tokens: int, widest: int | None = None) -> Callable[[Any], tuple[str, str] | None]:
    """A check of rendered segments: (too_long, detail) when they encode past the limit.
    `encode(segments) -> ids` encodes them as the target's tokenizer does (specials by name);
    `widest`: widest_token() of that tokenizer (None: every long prompt is encoded)."""
    def check(segments: Any) -> tuple[str, str] | None:
        if limit.max_prompt_tokens is None:
            return None
        text = sum(len(s.text.encode("utf-8")) for s in segments if hasattr(s, "text"))
        specials = sum(1 for s in segments if not hasattr(s, "text"))
        if (text + specials) * UNMEASURED_BYTES_FACTOR <= limit.max_prompt_tokens:
            return None
        if widest is not None and text // (SHRINK_FACTOR * widest) + specials > limit.max_prompt_tokens:
            size = (f"at least {text // (SHRINK_FACTOR * widest) + specials} tokens ({text} bytes of text, "
                    f"no token of the tokenizer spans more than {widest})")
        else:
            n = len(encode(segments))
            if n <= limit.max_prompt_tokens:
                return None
            size = f"{n} tokens"
        return TOO_LONG, (f"the prompt is {size} rendered by the {template_name} template; the target's "
                          f"context of {limit.context} tokens ({limit.source}) less generate.max_tokens "
                          f"{max_tokens} leaves {limit.max_prompt_tokens}; shorten the prompt, lower "
                          "generate.max_tokens, or leave its dataset out (prompts.datasets)")
    return check


def stage_metrics(t: Tally, params: PromptsParams, limit: LengthLimit | None = None):
    from draftgate.config import as_dict
    from draftgate.metrics import StageMetrics

    m = StageMetrics("prompts", rows_in=t.rows_in, rows_out=t.rows_out, params=as_dict(params))
    for reason, n in t.rejects_by_reason.items():
        m.drop(reason, n)
    if t.n_duplicates:
        m.drop("duplicate", t.n_duplicates)
    if t.n_capped:
        m.drop("over_max_prompts", t.n_capped)
    n_rejects = sum(t.rejects_by_reason.values())
    m.figures.update({
        "n_rejects": n_rejects,
        "rejects_rate": round(n_rejects / t.rows_in, 6) if t.rows_in else 0.0,
        "n_duplicates": t.n_duplicates,
        "n_capped": t.n_capped,
        "blank_lines": t.blank_lines,
        "final_assistant_dropped": t.final_assistant_dropped,
        "with_tools": t.with_tools,
        "modes": dict(sorted(t.by_mode.items())),
        "split": {"train": t.splits["train"], "heldout": t.splits["heldout"]},
        "heldout_fraction": round(t.splits["heldout"] / t.rows_out, 6) if t.rows_out else 0.0,
        "datasets": {d: {"in": n, "out": t.out_by_dataset[d], "rejects": t.rejects_by_dataset[d]}
                     for d, n in sorted(t.per_dataset_in.items())},
    })
    if limit is not None:
        m.figures["prompt_length"] = {"max_prompt_tokens": limit.max_prompt_tokens, "context": limit.context,
                                      "source": limit.source}
    return m


# ---------------------------------------------------------------- thin I/O

def raw_files(directory: str | Path) -> list[Path]:
    """`*.jsonl` and `*.parquet` directly under `directory`, sorted by name."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: not a directory; pass --raw DIR holding *.jsonl / *.parquet prompt files")
    files = sorted([*d.glob("*.jsonl"), *d.glob("*.parquet")], key=lambda p: p.name)
    if not files:
        raise FileNotFoundError(f"{d}: no *.jsonl or *.parquet files; add prompt files or fix --raw")
    return files


def read_raw(path: Path) -> Iterator[RawRecord]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        # Batch by batch (bounded memory); an unreadable file raises: the stage stops with exit 2.
        i = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                yield RawRecord(path.name, i, row)
                i += 1
        return
    with open(path, "rb") as f:
        # Split on b"\n" only: U+2028 and friends may sit inside JSON strings.
        for i, line in enumerate(f, start=1):
            yield RawRecord(path.name, i, line.rstrip(b"\r\n"))


# ---------------------------------------------------------------- helpers

def _present(obj: dict, key: str) -> bool:
    return obj.get(key) is not None


def _maybe_json(value: Any, where: str, reason: str) -> Any:
    # ShareGPT datasets (glaive, xlam, LLaMA-Factory) and Parquet files store nested fields as JSON text.
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as e:
        raise Rejected(reason, f"'{where}' is a string that is not valid JSON ({e}); store it as JSON") from None


def _check_json_values(value: Any, where: str, reason: Callable[[str], str]) -> None:
    """Reject a value JSON cannot carry (NaN, Infinity, bytes, a timestamp, a non-string key).

    A JSONL line cannot hold one (decode_line refuses NaN), but a Parquet row can: a float column
    inside a tool schema reads back as float('nan'). It is the record's fault, not the stage's."""
    todo = [(value, where)]
    while todo:
        v, path = todo.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                _not_json(reason(path), path, repr(v), "give a finite number or drop the key")
        elif isinstance(v, dict):
            for k in v:
                if not isinstance(k, str):
                    _not_json(reason(path), path, f"an object with the non-string key {k!r}", "use string keys")
            todo.extend((x, f"{path}.{k}") for k, x in reversed(v.items()))
        elif isinstance(v, (list, tuple)):
            todo.extend((x, f"{path}[{i}]") for i, x in reversed(list(enumerate(v))))
        elif not (v is None or isinstance(v, (str, int))):   # bool is an int
            _not_json(reason(path), path, f"a {type(v).__name__}", "store it as a string")


def _not_json(reason: str, path: str, what: str, fix: str) -> None:
    raise Rejected(reason, f"{path} is {what}, which JSON cannot hold; {fix} in the source file")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} overflows a float")
    return value


def _check_encodable(*texts: str | None) -> None:
    for text in texts:
        if text is None:
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise Rejected("invalid_utf8", f"a \\u escape at char {e.start} is a lone surrogate, not a character; "
                                           "fix the escape (pairs like \\ud83d\\ude00 are fine)") from None


def _truncate(data: bytes | dict) -> str:
    if isinstance(data, bytes):
        text = data.decode("utf-8", errors="backslashreplace")
    else:
        text = json.dumps(data, ensure_ascii=False, default=repr)
    if len(text) > RECORD_CHARS:
        text = text[:RECORD_CHARS] + f"…[{len(text) - RECORD_CHARS} more chars]"
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def _type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)
