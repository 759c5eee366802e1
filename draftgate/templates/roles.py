"""The verified special ids of a template by role: what the contract records for the gates and what
reconstruct parses completions with (one derivation, on the floor both reach without climbing)."""

from __future__ import annotations

from typing import Any, Mapping


def template_roles(template: Any, ids: Mapping[str, int]) -> dict[str, Any] | None:
    """The verified ids by role, for checks that recompute structure from ids alone."""
    names = set(template.special_names)
    if not names <= set(ids):
        return None
    markers = set()
    think = None
    if template.think_tokens:
        think = [ids[template.think_tokens[0]], ids[template.think_tokens[1]]]
        markers.update(template.think_tokens)
    pairs = [[ids[a], ids[b]] for a, b in template.tool_marker_pairs]
    for a, b in template.tool_marker_pairs:
        markers.update((a, b))
    # Kimi may run from reasoning straight into its tool-call section without </think>.
    implicit = [ids[template.tool_marker_pairs[0][0]]] if template.family == "kimi" else []
    inner = sorted(ids[n] for n in names if n in markers)
    return {
        "end_id": ids[template.end_token],
        "think_open": think[0] if think else None,
        "think_close": think[1] if think else None,
        "tool_pairs": pairs,
        "think_implicit_close": implicit,
        # Specials a completion may hold before its end: the think and tool-call markers. Any
        # other special id inside a completion (a turn header, the end token) is text gone wrong.
        "completion_markers": inner,
        "turn_structure": sorted(ids[n] for n in names if n not in markers),
    }
