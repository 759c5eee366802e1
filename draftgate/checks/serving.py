"""The composition gate's check: the serving profile as a table, and what a tool declaration looks
like in ids. expectations/composition.json recomputes each kept training row's serving mode from
its prompt ids and judges the shares; this only hands it what SQL cannot make.

`compute(inputs, params_path)` (handed to the engine by stages/gate_composition.py) returns

    profile       one row per served mode of params.yaml `serving.modes`: its name, thinking, tools
                  and the least shares (thresholds shaped as a table, not a measurement)
    trained       the splits the drafter trains on (drafter.splits): whose rows the shares count
    tool_marks    one row: `signature`, the ids (comma-joined) every tool declaration of the target's
                  template holds and no prompt without tools does, found by rendering probes with
                  the template as code and encoding them with the target's tokenizer and the
                  contract's verified special ids; null when the template declares no tools (ChatML)

The thinking markers come from the contract's roles in the view itself (the same ids the tokens
gate reads), never from the `thinking` / `mode` columns the stages wrote.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Callable

from draftgate.gates.compute import Computed
from draftgate.gates.suite import GateError

# Probes: two different tools (what differs between their declarations is the tool itself), with
# and without a system turn (what merges with the system text is not the declaration's own), and
# user turns that start differently (what follows the declaration is not part of it).
_USERS = ("What is the weather in Oslo?", "\nAdd 2 and 3.", " list the files", "¿Qué tiempo hace?", "(x)", "- a", "Hi")
# Not "You are ...": Kimi-K2's default system turn starts so, and would pass for the declaration's.
_SYSTEM = {"role": "system", "content": "Answer in French."}
_TOOLS = (
    [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                      "required": ["city"]}}}],
    [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                       "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                       "b": {"type": "integer"}}}}}],
    # A name that starts with punctuation (the id before it cannot be taken for the declaration's),
    # and no parameters (how a declaration's JSON ends is the tools', not the template's).
    [{"type": "function", "function": {"name": "_lookup"}}],
)
MIN_SIGNATURE = 3    # ids: a shorter common run could sit in ordinary text


def compute(inputs: dict[str, str], params_path: str) -> Computed:
    import pyarrow as pa

    from draftgate.config import ParamsError, load_params

    try:
        params = load_params(params_path)
    except ParamsError as e:
        raise GateError(str(e)) from None
    if "contract" not in inputs:
        raise GateError("the composition gate reads --input contract=data/contract/contract.json (the verified ids)")
    profile = [{"mode": m.name, "thinking": m.thinking, "tools": m.tools, "min_token_share": m.min_token_share,
                "min_row_share": m.min_row_share} for m in params.serving.modes]
    signature = tool_signature(params, _special_ids(inputs["contract"]))
    schema = pa.schema([("mode", pa.string()), ("thinking", pa.bool_()), ("tools", pa.bool_()),
                        ("min_token_share", pa.float64()), ("min_row_share", pa.float64())])
    marks = pa.table({"signature": pa.array([None if signature is None else ",".join(map(str, signature))],
                                            pa.string())})
    report = {"served_modes": [m["mode"] for m in profile],
              "tool_signature_ids": None if signature is None else len(signature)}
    trained = pa.table({"split": pa.array(list(params.drafter.splits), pa.string())})
    return Computed(tables={"profile": pa.Table.from_pylist(profile, schema=schema), "tool_marks": marks,
                            "trained": trained}, report=report)


def _special_ids(path: str) -> dict[str, int]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        ids = doc["special_ids"]
    except FileNotFoundError:
        raise GateError(f"{path}: not found; run the contract stage (dvc repro contract)") from None
    except (ValueError, KeyError, TypeError):
        raise GateError(f"{path}: no special_ids; rerun the contract stage") from None
    return ids


def tool_signature(params: Any, special_ids: dict[str, int]) -> list[int] | None:
    """The longest run of ids that every probe's tool declaration holds and no probe without tools
    does, or None when the template renders no tools. Template text and the tokenizer decide it,
    so no marker id or text is written here (Qwen3: its `</tools>` tail and `<tool_call></tool_call>`
    example; Kimi: `<|im_system|>tool_declare<|im_middle|>` and the namespace header)."""
    from draftgate.templates import TemplateError, encode_segments, get_template

    template = get_template(params.template.name)
    thinking = params.template.thinking
    try:
        probes = [(system + [{"role": "user", "content": text}], tools) for (system, tools), text in zip(
            [(s, t) for s in ([], [_SYSTEM]) for t in _TOOLS], _USERS)]
        with_tools = [template.render_prompt(msgs, tools, thinking) for msgs, tools in probes]
        without = [template.render_prompt(system + [{"role": "user", "content": _USERS[-1]}], None, thinking)
                   for system in ([], [_SYSTEM])]
    except TemplateError:
        return None      # the template declares no tools (ChatML): no prompt of it offers any
    tok = _tokenizer(params.tokenizer.kind, params.tokenizer.path, params.tokenizer.trust_remote_code)
    missing = sorted(set(template.special_names) - set(special_ids))
    if missing:
        raise GateError(f"the contract has no ids for {', '.join(missing)} (template {template.name}); rerun the "
                        "contract stage with this template")
    ids = {n: special_ids[n] for n in template.special_names}
    encoded = encode_segments(tok, with_tools + without, ids)
    run = common_run(encoded[:len(with_tools)], encoded[len(with_tools):], MIN_SIGNATURE)
    if run is None:   # never silently "no tools": the gate could not tell the mode at all
        raise GateError(f"template {template.name}: no run of {MIN_SIGNATURE}+ ids is shared by every probe's tool "
                        "declaration and absent without tools; the composition gate cannot tell a prompt's tools "
                        "from its ids (draftgate/checks/serving.py: add the template's case)")
    return run


@functools.lru_cache(maxsize=4)
def _tokenizer(kind: str, path: str | None, trust_remote_code: bool) -> Any:
    # Once per process: a test runs the gate several times (Qwen3's loads in ~2 s).
    from draftgate.config import TokenizerParams
    from draftgate.tokenizers import load_tokenizer

    return load_tokenizer(TokenizerParams(kind=kind, path=path, trust_remote_code=trust_remote_code))


def prompt_mode(ids: list[int], think: tuple[int, int] | None, blank: Callable[[int], bool],
                signature: list[int] | None) -> str:
    """A prompt's serving mode from its ids, by the rule expectations/composition.json's SQL applies:
    thinking off when the prompt ends on a closed think block (its last think marker is the close,
    only blank ids after it) or the template has no think markers; tools when it holds `signature`.
    For the eval gate, which holds per-mode floors over held-out prompts."""
    from draftgate.config import mode_name

    thinking = False
    if think is not None:
        last = next((i for i in range(len(ids) - 1, -1, -1) if ids[i] in think), None)
        thinking = not (last is not None and ids[last] == think[1] and all(blank(t) for t in ids[last + 1:]))
    tools = signature is not None and ("," + ",".join(map(str, signature)) + ",") in ("," + ",".join(map(str, ids)) + ",")
    return mode_name(thinking, tools)


def common_run(holders: list[list[int]], others: list[list[int]], shortest: int) -> list[int] | None:
    """The longest contiguous run of ids in every list of `holders` and in none of `others`
    (the first such run of the first holder at that length), or None below `shortest`."""
    first = holders[0]
    for n in range(_longest_common(first, holders[1]) if len(holders) > 1 else len(first), shortest - 1, -1):
        grams = [{tuple(h[i:i + n]) for i in range(len(h) - n + 1)} for h in holders[1:]]
        absent = [{tuple(o[i:i + n]) for i in range(len(o) - n + 1)} for o in others]
        for i in range(len(first) - n + 1):
            run = tuple(first[i:i + n])
            if all(run in g for g in grams) and not any(run in a for a in absent):
                return list(run)
    return None


def _longest_common(a: list[int], b: list[int]) -> int:
    """Length of the longest run common to a and b (dynamic programming, O(len a x len b)):
    no run shared by every holder is longer, so the search starts there (Qwen3: 1.6 s -> 0.1 s)."""
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        row = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                row[j] = prev[j - 1] + 1
                best = max(best, row[j])
        prev = row
    return best
