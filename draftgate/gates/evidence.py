"""The rows behind a failed check: up to N offending rows with their keys and the evidence the suite computes.

GX's BASIC result names a failed map check's first unexpected values only (a prompt id, a
"provider: ..." text): a reviewer also needs the row they came from (its prompt id, dataset,
shard and row) and what is wrong with it (the first differing token with its context, billed
vs counted, the probe's first differing bytes). After a failed run the gate reads the table once
more (only then, and only the columns needed: the keys below, each failing check's column and
the columns its suite entry names in `meta.evidence`), finds each failing check's first N
offending rows, and keeps them with their keys and evidence. A view recomputes on that pass (the
tokens view: ~0.5 s for 50k rows), which a passing gate never pays; evidence columns that no
check reads are not computed on the verdict's pass either (DuckDB drops unread columns of a view).

A suite entry says what to show in `meta.evidence`:

    "evidence": ["billed", "counted"]                      # columns shown beside each offending row
    "evidence": {"rows": "billing_disagrees",              # the offending rows: where this column is
                 "columns": ["billed", "counted"]}         #   not null (a check over an aggregate)

The evidence is the view's own: columns the suite computes from the data, never a column the
producing stage wrote about itself. A map check's offending rows are the ones GX counted, found
by GX's own rule for its type (RULES). A check over an aggregate (a rate, a minimum, a sum ratio)
has no unexpected rows of its own: its entry names the column that picks them (`rows`). Types
with neither (uniqueness: the sample already names the repeated values; custom row checks) keep
their GX sample only.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from draftgate.gates.result import SAMPLE, short

# Columns that identify a row, in the order shown, where the validated table has them.
KEYS = ("prompt_id", "dataset", "provider", "split", "setting", "shard", "row", "probe", "layout", "name")


def _between(s: Any, kw: dict) -> Any:
    import pandas as pd

    v = pd.to_numeric(s, errors="coerce")
    bad = s.notna() & v.isna()
    lo, hi = kw.get("min_value"), kw.get("max_value")
    if lo is not None:
        bad |= (v <= lo) if kw.get("strict_min") else (v < lo)
    if hi is not None:
        bad |= (v >= hi) if kw.get("strict_max") else (v > hi)
    return bad


# GX's rule for each type's unexpected rows (mostly ignored: the rows GX counted as unexpected).
RULES: dict[str, Callable[[Any, dict], Any]] = {
    "expect_column_values_to_be_null": lambda s, kw: s.notna(),
    "expect_column_values_to_not_be_null": lambda s, kw: s.isna(),
    "expect_column_values_to_be_in_set": lambda s, kw: s.notna() & ~s.isin(list(kw.get("value_set") or [])),
    "expect_column_values_to_not_be_in_set": lambda s, kw: s.notna() & s.isin(list(kw.get("value_set") or [])),
    "expect_column_values_to_be_between": _between,
    "expect_column_values_to_match_regex":
        lambda s, kw: s.notna() & ~s.map(lambda x: isinstance(x, str) and re.search(kw["regex"], x) is not None,
                                         na_action="ignore").fillna(True).astype(bool),
}


def spec_of(meta: dict) -> tuple[str | None, list[str]]:
    """(the column that picks the offending rows or None, the evidence columns) of an entry's meta."""
    ev = (meta or {}).get("evidence")
    if isinstance(ev, dict):
        return ev.get("rows"), list(ev.get("columns") or [])
    return None, list(ev or [])


def check(suite: Any, columns: list[str]) -> list[str]:
    """Every `meta.evidence` of `suite` against the validated table's `columns`: one message per
    problem, naming the suite file, the entry and the fix (the gate has no verdict while any)."""
    problems = []
    for i, s in enumerate(suite.expectations):
        ev = (s.meta or {}).get("evidence")
        if ev is None:
            continue
        where = f"{suite.path}: expectations[{i}] {s.type}({s.kwargs.get('column', '')}) meta.evidence"
        if isinstance(ev, dict):
            bad = [k for k in ev if k not in ("rows", "columns")]
            if bad or not isinstance(ev.get("columns", []), list) or not isinstance(ev.get("rows", ""), str):
                problems.append(f"{where}: expected {{\"rows\": COLUMN, \"columns\": [COLUMN, ...]}} or a list of "
                                f"columns, got {ev!r}")
                continue
        elif not isinstance(ev, list) or not all(isinstance(c, str) for c in ev):
            problems.append(f"{where}: expected a list of columns or {{\"rows\": COLUMN, \"columns\": [...]}}, got {ev!r}")
            continue
        rows, cols = spec_of(s.meta)
        missing = [c for c in ([rows] if rows else []) + cols if c not in columns]
        if missing:
            problems.append(f"{where} names {', '.join(map(repr, missing))}, not a column of the validated table; "
                            f"add it to the suite's view or drop it (columns: {', '.join(columns)})")
    return problems


def wanted(spec: Any, entry: dict) -> bool:
    """Whether the entry is a failed check whose offending rows can be found."""
    if entry.get("success") or entry.get("exception"):
        return False
    if spec_of(spec.meta)[0]:
        return True
    return bool(entry.get("unexpected_count")) and spec.type in RULES and isinstance(spec.kwargs.get("column"), str)


def offending_rows(loaded: Any, failed: dict[int, Any], n: int = SAMPLE) -> dict[int, list[dict]]:
    """{position: the first `n` offending rows of that check}, `failed`: {position: suite entry}
    (suite.ExpectationSpec), in table order, each row {key: value, ..., column: value, evidence...}
    in the order shown: the keys (KEYS), a map check's own column, the evidence as the suite lists it."""
    import pyarrow as pa

    from draftgate.gates.table import to_frame

    if not failed:
        return {}
    keys = [k for k in KEYS if k in loaded.columns]
    picks, shown = {}, {}
    for i, s in failed.items():
        rows, evidence = spec_of(s.meta)
        column = s.kwargs.get("column")
        # A map check shows its own column (the unexpected value); a check over an aggregate shows
        # the same figure on every row, so only the evidence.
        picks[i] = rows or column
        own = [column] if not rows and isinstance(column, str) else []
        shown[i] = list(dict.fromkeys([*keys, *own, *[c for c in evidence if c in loaded.columns]]))
    columns = list(dict.fromkeys([*(c for cols in shown.values() for c in cols), *picks.values()]))
    found: dict[int, list] = {i: [] for i in failed}
    for arrow in loaded.source.arrow_batches(columns):
        if arrow is None or not arrow.num_rows:
            continue
        frame = to_frame(arrow, arrow.num_rows, columns)
        # to_frame makes an integer column with nulls float64 (for GX); the rows show its integers.
        ints = {f.name for f in arrow.schema if pa.types.is_integer(f.type)}
        for i, spec in failed.items():
            if len(found[i]) >= n:
                continue
            try:
                bad = (frame[picks[i]].notna() if spec_of(spec.meta)[0]
                       else RULES[spec.type](frame[picks[i]], spec.kwargs))
            except (TypeError, ValueError, re.error):   # a column this rule cannot read: the verdict
                found[i] = [None] * n                    # and GX's sample stand, without rows
                continue
            for _, row in frame.loc[bad.to_numpy(dtype=bool), shown[i]].head(n - len(found[i])).iterrows():
                found[i].append({c: short(_plain(row[c], c in ints)) for c in shown[i]})
        if all(len(v) >= n for v in found.values()):
            break
    # Evidence a suite lists for several kinds of offending row (template: a text diff or an id diff)
    # is null for the other kind: a column empty on every row shown is left out, never the keys.
    out = {}
    for i, rows in found.items():
        if rows and rows[0] is not None:
            empty = {c for c in shown[i][len(keys):] if c != picks[i] and all(r[c] is None for r in rows)}
            out[i] = [{c: v for c, v in r.items() if c not in empty} for r in rows]
    return out


def _plain(v: Any, integer: bool = False) -> Any:
    try:
        import pandas as pd

        if not isinstance(v, (list, dict)) and pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return int(v) if integer and isinstance(v, float) and v.is_integer() else v
