"""The template gate's check: every probe's conversation read again, its shape features found here,
and every (feature, serving mode) of the catalogue counted from them and from the two renders.

The contract stage labels each probe with its shape features (templates/shapes.py
`shape_features`); this check never reads that label. It reads each probe's stored conversation
(`messages`, `tools`: JSON text as the prompts stage stores them) and its `thinking`, finds the
features with its own reading (`features_of`), and counts, per catalogue feature and mode:

    held      probes of that mode whose conversation has the feature
    rendered  of those, the ones the code template rendered (`code_text` present)
    compared  of those, the ones the official template rendered too (`official_text` present)
    equal     of those, the ones whose two renders are the same bytes

What it shares with the stage is the catalogue only (templates/shapes.py FEATURES and MODES: the
shapes the prompts stage admits, by name); a catalogue feature this reading cannot tell
(a family added there, not here) stops the gate with no verdict rather than counting it as never
held. `compute(inputs, params_path)` (handed to the engine by stages/gate_template.py) returns

    shape_coverage  one row per (feature, mode) in the catalogue's order, thinking on first: the
                    counts above, `covered_by` (the first probe whose renders are equal) and
                    `status` (covered | refused | uncovered | differs | never_held | no_official),
                    a description for reviewers: expectations/template.json judges from the counts

and the same rows in the gate's record (`computed.report.tables.shape_coverage`), which the gate's
page shows as a table.

The engine's rendering (`contract.engine: vllm`; draftgate/contract.py stored the engine's prompt
ids for each probe as received, under `engine`): `engine_render` encodes every stored conversation
again with the code template and the tokenizer of params.yaml (special ids resolved by name
here, not taken from contract.json) and holds the stored ids equal to its own, one row per probe
the code template renders:

    status      equal | special_text (equal once our text segments are encoded with added tokens
                parsed, as the engine encodes its rendered text: the conversation spells a special
                token) | differs | engine_refuses | not_asked (the stage never asked the engine)
    first_diff  the first differing token position, with the ids and their text around it

The suite fails differs and not_asked (`differs`) and engine_refuses (`code_invents`). No engine
runs here: its answer is the stage's evidence, as the official text is; what the gate redoes is
our side and the comparison. params.yaml saying vllm over a contract.json without the engine's
answers stops the gate with no verdict (a stale contract stage).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from draftgate.gates.compute import Computed
from draftgate.gates.suite import GateError

INPUT = "template"     # the suite's artifact: data/contract/contract.json

_KIND = r"(system|user|assistant|calls|tool)"
# Every feature name this reading can produce. The catalogue must stay inside it.
READABLE = re.compile("|".join((
    rf"first:{_KIND}", rf"turn:{_KIND}>{_KIND}", rf"last:{_KIND}",
    rf"name:{_KIND}:(text|empty)", r"calls_content:(none|text)", r"tools:(absent|one|several)",
    r"calls:(one|several)", r"reasoning:(assistant|calls):(present|empty|absent):(history|loop):(before|last|after)",
    r"text:(assistant_leading_newline|assistant_think_markup|user_tool_response_wrapped"
    r"|user_tool_response_wrapped_after_reasoning)")))

STATUS_NOTE = ("covered: a conversation holding it rendered byte for byte alike by both templates; refused: the "
               "code template renders none holding it, so the prompts stage rejects such prompts; uncovered: "
               "admitted but never rendered by the official template; differs: compared, never equal; "
               "never_held: no probe holds it; no_official: nothing to compare with")


def _kind(m: dict) -> str:
    role = m.get("role")
    return "calls" if role == "assistant" and m.get("tool_calls") else str(role)


def _wrapped(m: dict) -> bool:
    text = m.get("content")
    return m.get("role") == "user" and isinstance(text, str) and text.startswith("<tool_response>") \
        and text.endswith("</tool_response>")


def features_of(messages: list[dict], tools: list | None) -> set[str]:
    """Every feature name a conversation has under the catalogue's grammar (READABLE); the caller
    keeps the catalogue's. Read turn by turn: where each turn stands (after the last user turn or
    not, against the last plain assistant reply) and what its fields hold (a null counts as absent,
    as the prompts stage stores it)."""
    kinds = [_kind(m) for m in messages]
    found = {"tools:" + ("absent" if not tools else "one" if len(tools) == 1 else "several")}
    if not kinds:
        return found
    found |= {f"first:{kinds[0]}", f"last:{kinds[-1]}"}
    found |= {f"turn:{kinds[i]}>{kinds[i + 1]}" for i in range(len(kinds) - 1)}
    users = [i for i, k in enumerate(kinds) if k == "user"]
    replies = [i for i, k in enumerate(kinds) if k == "assistant"]
    last_user = users[-1] if users else -1
    last_reply = replies[-1] if replies else -1
    # Turns with reasoning that some real query (a user turn not wrapped in <tool_response>) precedes.
    first_query = next((i for i in users if not _wrapped(messages[i])), None)
    for i, (m, k) in enumerate(zip(messages, kinds)):
        text = m.get("content")
        if m.get("name") is not None:
            found.add(f"name:{k}:{'empty' if m['name'] == '' else 'text'}")
        if _wrapped(m):
            found.add("text:user_tool_response_wrapped")
            if first_query is not None and any(
                    first_query < j < i and kinds[j] in ("assistant", "calls") and messages[j].get("reasoning_content")
                    for j in range(i)):
                found.add("text:user_tool_response_wrapped_after_reasoning")
        if k not in ("assistant", "calls"):
            continue
        if isinstance(text, str):
            if text[:1] == "\n":
                found.add("text:assistant_leading_newline")
            if "</think>" in text:
                found.add("text:assistant_think_markup")
        if k == "calls":
            found.add("calls:" + ("one" if len(m["tool_calls"]) == 1 else "several"))
            found.add("calls_content:" + ("text" if isinstance(text, str) and text != "" else "none"))
        reasoning = m.get("reasoning_content")
        state = "absent" if reasoning is None else "empty" if reasoning == "" else "present"
        where = "loop" if i > last_user else "history"
        against = "last" if i == last_reply else "before" if i < last_reply else "after"
        found.add(f"reasoning:{k}:{state}:{where}:{against}")
    return found


def _load(path: str) -> tuple[list[dict], dict | None]:
    """(the probes, the rendering engine's record or None)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GateError(f"{path}: not found; run the contract stage (dvc repro contract)") from None
    except ValueError as e:
        raise GateError(f"{path}: not JSON ({e}); rerun the contract stage (dvc repro contract)") from None
    probes = doc.get("template_probes") if isinstance(doc, dict) else None
    if not isinstance(probes, list):
        raise GateError(f"{path}: no \"template_probes\" list; rerun the contract stage (dvc repro contract)")
    tc = doc.get("template_contract")
    engine = tc.get("engine") if isinstance(tc, dict) else None
    return probes, engine if isinstance(engine, dict) else None


def _conversation(p: Any, i: int, path: str) -> tuple[str, bool, list[dict], list | None]:
    where = f"{path}: template_probes[{i}]"
    if not isinstance(p, dict):
        raise GateError(f"{where} is not an object; rerun the contract stage (dvc repro contract)")
    where += f" ({p.get('probe')!r})"
    if "messages" not in p or "tools" not in p:
        raise GateError(f"{where} has no stored conversation (\"messages\", \"tools\"): the contract stage that "
                        "wrote it predates them; rerun it (dvc repro contract)")
    try:
        messages = json.loads(p["messages"])
        tools = None if p["tools"] is None else json.loads(p["tools"])
    except (TypeError, ValueError) as e:
        raise GateError(f"{where}: \"messages\"/\"tools\" must be JSON text ({e}); rerun the contract stage") from None
    if not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)) \
            or not (tools is None or isinstance(tools, list)) or not isinstance(p.get("thinking"), bool):
        raise GateError(f"{where}: \"messages\" must be a list of objects, \"tools\" a list or null and "
                        "\"thinking\" a boolean; rerun the contract stage (dvc repro contract)")
    return str(p.get("probe")), p["thinking"], messages, tools


def coverage(probes: list[dict], path: str = "contract.json") -> list[dict]:
    """One row per (catalogue feature, mode), counted from the probes' conversations and renders."""
    from draftgate.templates.shapes import FEATURES, MODES

    unreadable = [f for f, _ in FEATURES if not READABLE.fullmatch(f)]
    if unreadable:
        raise GateError(f"the shape catalogue (draftgate/templates/shapes.py) has features the template gate "
                        f"cannot read: {', '.join(unreadable)}; teach draftgate/checks/template.py features_of them")
    catalogue = {f for f, _ in FEATURES}
    read = []
    for i, p in enumerate(probes):
        name, thinking, messages, tools = _conversation(p, i, path)
        code, official = p.get("code_text"), p.get("official_text")
        read.append((name, thinking, features_of(messages, tools) & catalogue, code is not None,
                     code is not None and official is not None, code is not None and code == official))
    has_official = any(p.get("official_text") is not None for p in probes)
    rows = []
    for thinking in MODES:
        for feature, family in FEATURES:
            held = [r for r in read if r[1] == thinking and feature in r[2]]
            counts = {k: sum(r[j] for r in held) for k, j in (("rendered", 3), ("compared", 4), ("equal", 5))}
            rows.append({"feature": feature, "family": family, "thinking": thinking, "held": len(held), **counts,
                         "covered_by": next((r[0] for r in held if r[5]), None),
                         "status": _status(len(held), **counts, has_official=has_official)})
    return rows


def _status(held: int, rendered: int, compared: int, equal: int, has_official: bool) -> str:
    if not held:
        return "never_held"
    if not rendered:
        return "refused"
    if not has_official:
        return "no_official"
    return "covered" if equal else "differs" if compared else "uncovered"


ENGINE_NOTE = ("the engine's prompt ids (/v1/chat/completions/render, stored by the contract stage) against ours, "
               "encoded here from each stored conversation: equal; special_text: equal once our text is encoded "
               "with added tokens parsed (the conversation spells a special token, which the engine turns into "
               "it); differs; engine_refuses; not_asked")


def engine_render(probes: list[dict], engine: dict | None, params_path: str, path: str = "contract.json") -> list[dict]:
    """One row per probe the code template renders (this checkout's, on the stored conversation):
    the engine's stored ids against ours. No rows when no engine rendered and params.yaml asks none."""
    from draftgate.config import ParamsError, load_params

    try:
        params = load_params(params_path)
    except ParamsError as e:
        raise GateError(f"{params_path}: {e}") from None
    if engine is None:
        if params.contract.engine != "off":
            raise GateError(f"{params_path} sets contract.engine: {params.contract.engine}, but {path} holds no "
                            "engine rendering (template_contract.engine): rerun the contract stage (dvc repro contract)")
        return []
    from draftgate.templates import TemplateError, encode_segments, get_template
    from draftgate.tokenizers import load_tokenizer

    template = get_template(params.template.name)
    tok = load_tokenizer(params.tokenizer)
    ids = {n: tok.token_id(n) for n in template.special_names}
    if None in ids.values():
        raise GateError(f"{tok.name} has no token for {sorted(n for n, i in ids.items() if i is None)} (template "
                        f"{template.name}); gate_contract names the fix")
    rows = []
    for i, p in enumerate(probes):
        name, thinking, messages, tools = _conversation(p, i, path)
        try:
            segments = template.render_prompt(messages, tools, thinking)
        except TemplateError:
            continue            # the prompts stage rejects such a prompt: the engine never serves it
        ours, ours_parsed = (encode_segments(enc, [segments], ids)[0] for enc in (tok, _Parsed(tok)))
        answer = p.get("engine") if isinstance(p.get("engine"), dict) else {}
        got = answer.get("ids")
        row = {"probe": name, "thinking": thinking, "first_diff": None, "engine_around": None, "ours_around": None,
               "engine_ids": None, "ours_ids": None, "detail": answer.get("detail")}
        if not answer:
            row["status"] = "not_asked"
        elif got is None:
            row["status"] = "engine_refuses"
        elif got == ours:
            row["status"] = "equal"
        else:
            row["status"] = "special_text" if got == ours_parsed else "differs"
            row.update(_first_difference(got, ours, tok))
        rows.append(row)
    return rows


class _Parsed:
    """An encoder of whole rendered text, as a serving engine encodes it (added tokens parsed)."""

    def __init__(self, tok: Any):
        self.encode_ordinary_batch = tok.encode_batch


def _first_difference(engine: list[int], ours: list[int], tok: Any) -> dict[str, Any]:
    at = next((k for k, (a, b) in enumerate(zip(engine, ours)) if a != b), min(len(engine), len(ours)))
    start = max(at - 4, 0)
    sides = {}
    for side, ids in (("engine", engine), ("ours", ours)):
        sides[f"{side}_ids"] = " ".join(map(str, ids[start:at + 4])) or "(end)"
        sides[f"{side}_around"] = (json.dumps(tok.decode(ids[start:at]), ensure_ascii=False) + " ⟦"
                                   + json.dumps(tok.decode(ids[at:at + 1]), ensure_ascii=False) + "⟧ "
                                   + json.dumps(tok.decode(ids[at + 1:at + 4]), ensure_ascii=False))
    return {"first_diff": at, **sides}


def compute(inputs: dict[str, str], params_path: str) -> Computed:
    import pyarrow as pa

    if INPUT not in inputs:
        raise GateError(f"the template gate reads its artifact as {INPUT}= (data/contract/contract.json); "
                        f"given: {', '.join(sorted(inputs))}")
    probes, engine = _load(inputs[INPUT])
    rows = coverage(probes, inputs[INPUT])
    engine_rows = engine_render(probes, engine, params_path, inputs[INPUT])
    schema = pa.schema([("feature", pa.string()), ("family", pa.string()), ("thinking", pa.bool_()),
                        ("held", pa.int64()), ("rendered", pa.int64()), ("compared", pa.int64()),
                        ("equal", pa.int64()), ("covered_by", pa.string()), ("status", pa.string())])
    statuses = {s: sum(r["status"] == s for r in rows)
                for s in ("covered", "refused", "uncovered", "differs", "never_held", "no_official")}
    report = {"shape_features": statuses,
              "tables": {"shape_coverage": {"note": STATUS_NOTE, "columns": schema.names, "rows": rows}}}
    engine_schema = pa.schema([("probe", pa.string()), ("thinking", pa.bool_()), ("status", pa.string()),
                               ("first_diff", pa.int64()), ("engine_around", pa.string()), ("ours_around", pa.string()),
                               ("engine_ids", pa.string()), ("ours_ids", pa.string()), ("detail", pa.string())])
    if engine is not None:      # without an engine the record is as it always was
        report["engine"] = {**engine, "statuses": {s: sum(r["status"] == s for r in engine_rows) for s in
                                                   ("equal", "special_text", "differs", "engine_refuses", "not_asked")}}
        report["tables"]["engine_render"] = {"note": ENGINE_NOTE, "columns": engine_schema.names, "rows": engine_rows}
    return Computed(tables={"shape_coverage": pa.Table.from_pylist(rows, schema=schema),
                            "engine_render": pa.Table.from_pylist(engine_rows, schema=engine_schema)}, report=report)
