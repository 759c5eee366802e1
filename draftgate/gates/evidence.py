"""The rows behind a failed check: up to N offending rows with their keys, for the result and the page.

GX's BASIC result names a failed map check's first unexpected values only (a prompt id, a
"provider: ..." text): a reviewer also needs the row they came from, its prompt id, dataset,
shard and row. After a failed run the gate reads the table once more (only then, and only the
columns needed: the keys below, each failing check's column and the columns its suite entry
names in `meta.evidence`), finds each failing check's first N unexpected rows by GX's own rule
for that type, and keeps them with their keys. A view recomputes on that pass (the tokens view:
~0.5 s for 50k rows), which a passing gate never pays.

Types whose unexpected rows this module cannot tell from a column (uniqueness: the sample
already names the repeated values; custom row checks; aggregates) keep their GX sample only.
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


def wanted(spec: Any, entry: dict) -> bool:
    """Whether the entry is a failed check whose offending rows can be found."""
    return (not entry.get("success") and bool(entry.get("unexpected_count")) and spec.type in RULES
            and isinstance(spec.kwargs.get("column"), str))


def offending_rows(loaded: Any, failed: dict[int, Any], n: int = SAMPLE) -> dict[int, list[dict]]:
    """{position: the first `n` offending rows of that check}, `failed`: {position: suite entry}
    (suite.ExpectationSpec), in table order, each row {key: value, ..., column: value, evidence...}."""
    from draftgate.gates.table import to_frame

    if not failed:
        return {}
    keys = [k for k in KEYS if k in loaded.columns]
    shown = {i: list(dict.fromkeys([*keys, s.kwargs["column"],
                                    *[c for c in s.meta.get("evidence", []) if c in loaded.columns]]))
             for i, s in failed.items()}
    columns = list(dict.fromkeys(c for cols in shown.values() for c in cols))
    found: dict[int, list[dict]] = {i: [] for i in failed}
    for arrow in loaded.source.arrow_batches(columns):
        if arrow is None or not arrow.num_rows:
            continue
        frame = to_frame(arrow, arrow.num_rows, columns)
        for i, spec in failed.items():
            if len(found[i]) >= n:
                continue
            try:
                bad = RULES[spec.type](frame[spec.kwargs["column"]], spec.kwargs)
            except (TypeError, ValueError, re.error):   # a column this rule cannot read: the verdict
                found[i] = [None] * n                    # and GX's sample stand, without rows
                continue
            for _, row in frame.loc[bad.to_numpy(dtype=bool), shown[i]].head(n - len(found[i])).iterrows():
                found[i].append({c: short(_plain(row[c])) for c in shown[i]})
        if all(len(v) >= n for v in found.values()):
            break
    return {i: rows for i, rows in found.items() if rows and rows[0] is not None}


def _plain(v: Any) -> Any:
    try:
        import pandas as pd

        if not isinstance(v, (list, dict)) and pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return v
