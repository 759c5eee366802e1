"""Special-token structure of one completion, checked on ids (what the drafter will see).

Each flag is True when the structure is sound. A completion cut by `length` may stop inside a
block (reasoning or a tool call), so an open block at the very end is allowed only then.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence


@dataclass(frozen=True)
class Markers:
    end: int                                # the template's end-of-turn id
    think: tuple[int, int] | None           # (open, close) ids, None when the template has none
    tool_pairs: tuple[tuple[int, int], ...]  # (open, close) per nesting level, outermost first
    # Ids that also end an open think block: Kimi-K2 may go from reasoning straight into its
    # tool-call section without `</think>`, a form its template renders (think_closed=False).
    think_implicit_close: frozenset[int] = frozenset()

    @cached_property
    def all_ids(self) -> frozenset[int]:
        pairs = ([self.think] if self.think else []) + list(self.tool_pairs)
        return frozenset(i for p in pairs for i in p) | self.think_implicit_close


@dataclass(frozen=True)
class Flags:
    ends_with_eos: bool
    think_balanced: bool
    tool_markers_balanced: bool


def flags(completion: Sequence[int], prompt: Sequence[int], truncated: bool, m: Markers,
          seen: Sequence[int] | None = None, think_open: bool | None = None) -> Flags:
    """`seen`: the completion's marker ids in order when the caller already knows them (a text
    render: its Special segments); otherwise one pass over the ids finds them. `think_open`:
    `prompt_think_open(prompt, m)` when the caller has it (one prompt, many responses)."""
    if seen is None:
        wanted = m.all_ids
        seen = [i for i in completion if i in wanted]
    think_ok = True
    if m.think is not None:
        if think_open is None:
            think_open = prompt_think_open(prompt, m)
        think_ok = balanced(seen, *m.think, start_open=think_open, truncated=truncated,
                            implicit=m.think_implicit_close)
    tools_ok = all(balanced(seen, o, c, truncated=truncated) for o, c in m.tool_pairs)
    return Flags(ends_with_eos=bool(completion) and completion[-1] == m.end,
                 think_balanced=think_ok, tool_markers_balanced=tools_ok)


def prompt_think_open(prompt: Sequence[int], m: Markers) -> bool:
    # A generation prompt that prefills `<think>` leaves the completion inside the block.
    return m.think is not None and _depth(prompt, *m.think) == 1


def balanced(ids: Sequence[int], open_id: int, close_id: int, start_open: bool = False,
             truncated: bool = False, implicit: frozenset[int] = frozenset()) -> bool:
    """Opens and closes alternate (no nesting, no close before open); ends closed unless cut."""
    is_open = start_open
    for i in ids:
        if i == open_id:
            if is_open:
                return False
            is_open = True
        elif i == close_id:
            if not is_open:
                return False
            is_open = False
        elif is_open and i in implicit:
            is_open = False
    return not is_open or truncated


def _depth(ids: Sequence[int], open_id: int, close_id: int) -> int:
    # Only the tail after the last marker matters: earlier turns are closed or the prompt is bad.
    # The last of each, searched by list.index on the reversed ids (C speed, no loop here).
    rev = list(reversed(ids))
    return 1 if _index(rev, open_id) < _index(rev, close_id) else 0


def _index(ids: list[int], x: int) -> int:
    try:
        return ids.index(x)
    except ValueError:
        return len(ids)
