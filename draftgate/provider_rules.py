"""What providers change in a request before templating, applied to our render of the prompt.

A provider that rewrites the request renders (and bills) a prompt other than the one the client
sent; the ids the model saw are those of the rewritten request. Each rule names its evidence
(docs/provider-rules.md); rules are chosen in params (reconstruct.request_rules), never guessed.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from draftgate.config import REQUEST_RULES


def drop_function_strict(tools: list[dict]) -> list[dict]:
    """Remove `strict` from each function declaration.

    Evidence: Qwen3 tool requests on Novita and DeepInfra were billed exactly 5 prompt tokens per
    tool below the official template's count of the request as sent, and equal to it once
    `"strict": false` was removed from each function (4 of 4 recorded requests).
    """
    out = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and "strict" in fn:
            t = {**t, "function": {k: v for k, v in fn.items() if k != "strict"}}
        out.append(t)
    return out


RULES: dict[str, Callable[[list[dict]], list[dict]]] = {
    "drop_function_strict": drop_function_strict,
}
if tuple(RULES) != REQUEST_RULES:     # params name the rules: a rule params cannot choose is dead code
    raise ImportError(f"provider_rules.RULES {tuple(RULES)} != config.REQUEST_RULES {REQUEST_RULES}: "
                      "list every rule's name in draftgate/config.py REQUEST_RULES, in RULES' order")


def apply_rules(tools: Any, rules: Sequence[str]) -> Any:
    """The tools as the provider templates them (key order of everything else kept)."""
    if not tools or not isinstance(tools, list):
        return tools
    for name in rules:
        try:
            tools = RULES[name](tools)
        except KeyError:
            raise ValueError(f"unknown request rule {name!r}; known: {', '.join(RULES)}") from None
    return tools
