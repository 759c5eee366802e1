"""Property: whatever the model sampled and whatever the provider did to it, every row is either
exact or classified correctly, never silently wrong.

A completion is drawn as token ids from the real Qwen3 vocabulary around the template's special
tokens (think block, tool calls, end token), canonical or not. A simulated provider decodes it,
splits reasoning / content / tool calls the way serving parsers do, and applies quirks. The
oracle is independent of the code under test: it writes the provider's view back in the format
docs/templates.md documents and compares bytes with what the model produced.
"""

from __future__ import annotations

import json
import re
import unicodedata

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from draftgate.reconstruct.core import Setup, reconstruct
from draftgate.templates import get_template

N_ORDINARY = 151643   # Qwen3's BPE ranks; added tokens start here
PROMPTS = {"p": {"prompt_id": "p", "dataset": "d", "split": "train", "tools": None,
                 "messages": json.dumps([{"role": "user", "content": "Go."}])}}
ARGS = ['{"a": 1}', '{"a":1,  "b" : [1,2]}', '{"q": "caf\\u00e9"}', "{}"]


@pytest.fixture(scope="module")
def pieces(qwen3_tok):
    """Ordinary ids whose bytes are whole UTF-8 text, and a few that are not (split characters)."""
    whole, partial = [], []
    for i in range(N_ORDINARY):
        b = qwen3_tok.token_bytes(i)
        try:
            b.decode("utf-8")
            whole.append(i)
        except UnicodeDecodeError:
            partial.append(i)
    return whole, partial


def pick(ids: list[int]):
    # An index, not sampled_from: hypothesis inspects every element of a sampled list per draw.
    return st.integers(0, len(ids) - 1).map(ids.__getitem__)


def spans(pieces):
    whole, partial = pieces
    return st.lists(st.one_of(pick(whole), pick(whole), pick(whole), pick(partial)), max_size=12)


def encode_part(tok, text_ids: list[list[int]], canonical: bool) -> list[int]:
    """A text segment made of literal pieces and drawn ids: canonical re-encodes the joined text."""
    ids = [i for part in text_ids for i in part]
    if canonical:
        return tok.encode_ordinary(b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", "replace"))
    return ids


# ---------------------------------------------------------------- the simulated provider

def qwen3_provider(text: str, trim: bool, inline_reasoning: bool, reserialise: bool) -> dict:
    body = text.removesuffix("<|im_end|>")
    m = re.fullmatch(r"<think>(.*?)</think>(.*)", body, re.S)
    reasoning, rest = m.group(1), m.group(2).removeprefix("\n\n")   # the template's separator
    content, _, calls_text = rest.partition("<tool_call>")
    calls = []
    for k, raw in enumerate(re.findall(r"<tool_call>\n(.*?)\n</tool_call>", "<tool_call>" + calls_text, re.S)):
        name = re.match(r'\{"name": "([^"]+)", "arguments": ', raw).group(1)
        args = raw[raw.index('"arguments": ') + len('"arguments": '):-1]
        if reserialise:
            args = json.dumps(json.loads(args))
        calls.append({"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": args}})
    if calls:
        content = content.removesuffix("\n")   # the separator the template writes before a call
    if trim:
        reasoning, content = reasoning.strip(), content.strip()
    if inline_reasoning:
        content, reasoning = f"<think>{reasoning}</think>{content}", None
    return {"reasoning": reasoning, "content": content, "tool_calls": json.dumps(calls) if calls else None}


def qwen3_oracle(view: dict, trim_undo: dict) -> str:
    # The provider's pieces, written back in Qwen3's documented assistant format.
    r, c = trim_undo["reasoning"], trim_undo["content"]
    out = f"<think>\n{r.strip(chr(10))}\n</think>\n\n{c.lstrip(chr(10))}"
    calls = json.loads(view["tool_calls"] or "[]")
    for k, tc in enumerate(calls):
        if k > 0 or c:
            out += "\n"
        out += f'<tool_call>\n{{"name": "{tc["function"]["name"]}", "arguments": {tc["function"]["arguments"]}}}\n</tool_call>'
    return out + "<|im_end|>"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_qwen3_random_completions_through_a_quirky_provider_are_exact_or_correctly_classified(
        qwen3_tok, pieces, data):
    tok = qwen3_tok
    ids_of = tok.token_id
    canonical = data.draw(st.booleans(), "canonical")
    r_ids, c_ids = data.draw(spans(pieces), "reasoning"), data.draw(spans(pieces), "content")
    n_calls = data.draw(st.integers(0, 2), "calls")
    call_args = [data.draw(st.sampled_from(ARGS), "args") for _ in range(n_calls)]
    trim, inline, reserialise = (data.draw(st.booleans(), q) for q in ("trim", "inline", "reserialise"))

    nl, nl2 = tok.encode_ordinary("\n"), tok.encode_ordinary("\n\n")
    truth = [ids_of("<think>")] + encode_part(tok, [nl, r_ids, nl], canonical) + [ids_of("</think>")]
    # The newline before the first call belongs to the content's text segment (it can merge).
    truth += encode_part(tok, [nl2, c_ids] + ([nl] if c_ids and call_args else []), canonical)
    for k, args in enumerate(call_args):
        if k > 0:
            truth += nl
        body = tok.encode_ordinary('\n{"name": "add", "arguments": ' + args + "}\n")
        truth += [ids_of("<tool_call>")] + body + [ids_of("</tool_call>")]
    truth.append(ids_of("<|im_end|>"))

    model_bytes = b"".join(tok.token_bytes(i) for i in truth)
    text = tok.decode(truth)                  # what the provider sees (U+FFFD for broken bytes)
    view = qwen3_provider(text, trim, inline, reserialise)
    before_inline = qwen3_provider(text, trim, False, reserialise)
    expected_text = unicodedata.normalize("NFC", qwen3_oracle(view, before_inline))

    row = {"prompt_id": "p", "dataset": "d", "status": "ok", "finish_reason": "stop",
           "reasoning_details": None, "provider": "sim", "billed_completion_tokens": len(truth),
           "logprobs": None, "truth_ids": truth, **view}
    t = get_template("qwen3")
    out = reconstruct([row], PROMPTS, Setup(tok, t, {n: ids_of(n) for n in t.special_names}, True)).rows[0]

    event(out["match"])
    assert out["quarantine_reason"] is None, out
    assert out["completion_ids"] == truth                       # the real ids always win
    text_changed = expected_text.encode("utf-8") != model_bytes
    assert out["match"] == ("semantic" if text_changed else out["match"])
    if not text_changed:
        assert out["match"] in ("exact", "bpe_only")
        if canonical:
            assert out["match"] == "exact"
    if out["match"] == "bpe_only":
        ctx = json.loads(out["diff_context"])
        assert ctx["pos"] == out["first_diff"]
    if out["match"] == "semantic":
        assert text_changed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_kimi_random_completions_with_stripped_ids_are_exact_or_correctly_classified(
        kimi_standin_tok, pieces, data):
    tok = kimi_standin_tok
    ids_of = tok.token_id
    whole, _ = pieces
    r_ids = data.draw(st.lists(pick(whole), max_size=10), "reasoning")
    c_ids = data.draw(st.lists(pick(whole), max_size=10), "content")
    args = data.draw(st.sampled_from(ARGS), "args")
    strip_prefix, trim = data.draw(st.booleans(), "strip"), data.draw(st.booleans(), "trim")

    truth = r_ids + [ids_of("</think>")] + c_ids
    truth += [ids_of("<|tool_calls_section_begin|>"), ids_of("<|tool_call_begin|>")]
    truth += tok.encode_ordinary("functions.add:0") + [ids_of("<|tool_call_argument_begin|>")]
    truth += tok.encode_ordinary(args) + [ids_of("<|tool_call_end|>"), ids_of("<|tool_calls_section_end|>"),
                                          ids_of("<|im_end|>")]
    reasoning, content = tok.decode(r_ids), tok.decode(c_ids)
    if trim:
        reasoning, content = reasoning.strip(), content.strip()
    call_id = "add:0" if strip_prefix else "functions.add:0"
    row = {"prompt_id": "p", "dataset": "d", "status": "ok", "finish_reason": "tool_calls",
           "reasoning": reasoning, "reasoning_details": None, "content": content, "provider": "sim",
           "tool_calls": json.dumps([{"id": call_id, "type": "function",
                                      "function": {"name": "add", "arguments": args}}]),
           "billed_completion_tokens": len(truth), "logprobs": None, "truth_ids": truth}
    t = get_template("kimi_k25")
    out = reconstruct([row], PROMPTS, Setup(tok, t, {n: ids_of(n) for n in t.special_names}, True)).rows[0]

    model_bytes = b"".join(tok.token_bytes(i) for i in truth)
    expected = unicodedata.normalize("NFC", f"{reasoning}</think>{content}<|tool_calls_section_begin|>"
                                     f"<|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>{args}"
                                     "<|tool_call_end|><|tool_calls_section_end|><|im_end|>")
    event(out["match"])
    assert out["quarantine_reason"] is None and out["completion_ids"] == truth
    assert ("tool_id_restored" in json.loads(out["normalisations"])) is strip_prefix
    if expected.encode("utf-8") == model_bytes:
        assert out["match"] in ("exact", "bpe_only")
    else:
        assert out["match"] == "semantic"
