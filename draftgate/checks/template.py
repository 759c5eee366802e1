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


def _load(path: str) -> list[dict]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GateError(f"{path}: not found; run the contract stage (dvc repro contract)") from None
    except ValueError as e:
        raise GateError(f"{path}: not JSON ({e}); rerun the contract stage (dvc repro contract)") from None
    probes = doc.get("template_probes") if isinstance(doc, dict) else None
    if not isinstance(probes, list):
        raise GateError(f"{path}: no \"template_probes\" list; rerun the contract stage (dvc repro contract)")
    return probes


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


def compute(inputs: dict[str, str], params_path: str) -> Computed:
    import pyarrow as pa

    if INPUT not in inputs:
        raise GateError(f"the template gate reads its artifact as {INPUT}= (data/contract/contract.json); "
                        f"given: {', '.join(sorted(inputs))}")
    rows = coverage(_load(inputs[INPUT]), inputs[INPUT])
    schema = pa.schema([("feature", pa.string()), ("family", pa.string()), ("thinking", pa.bool_()),
                        ("held", pa.int64()), ("rendered", pa.int64()), ("compared", pa.int64()),
                        ("equal", pa.int64()), ("covered_by", pa.string()), ("status", pa.string())])
    statuses = {s: sum(r["status"] == s for r in rows)
                for s in ("covered", "refused", "uncovered", "differs", "never_held", "no_official")}
    report = {"shape_features": statuses,
              "tables": {"shape_coverage": {"note": STATUS_NOTE, "columns": schema.names, "rows": rows}}}
    return Computed(tables={"shape_coverage": pa.Table.from_pylist(rows, schema=schema)}, report=report)
