"""One table's GX results from the results of its batches: the same figures as one whole-table run.

A gate validates its table in batches of `table.BATCH_ROWS` rows, so its memory does not grow with
the table (docs/great-expectations.md, "Gates in bounded memory"). A table that fits in one batch
is validated exactly as before; otherwise each expectation's batch results merge here:

- row-level checks (every column-map, pair-map and multicolumn-map expectation): counts add up,
  the unexpected sample is the first ones in table order, percentages and the `mostly` verdict are
  recomputed with GX's own formulas (great_expectations/expectations/expectation.py:
  `_format_map_output`, `_mostly_success`, and the not-null special case);
- uniqueness looks across rows, so a batch cannot judge it: the values' 64-bit hashes, taken as
  the batches go by (8 bytes a row), count the rows whose value occurs more than once in the
  whole table, and their first values are read back (`Duplicates`, table.Loaded.duplicates);
- aggregates: row count (sum), column max / min, the table's columns (the same in every batch),
  our value fraction (hits = fraction x batch rows, summed) and sum ratio (sums carried in the
  result's details).

An expectation of any other type (GX's median, stdev, increasing values, a custom table metric)
cannot be merged: `batchable` says so and the gate validates that suite's table whole, as before.
Everything here is a pure function of plain dicts, so the rules are testable without GX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Row-level checks that compare rows with each other: not mergeable from batches.
CROSS_ROW = {"expect_compound_columns_to_be_unique", "expect_multicolumn_values_to_be_unique",
             "expect_column_values_to_be_increasing", "expect_column_values_to_be_decreasing"}
UNIQUE = "expect_column_values_to_be_unique"       # cross-row, merged by a DuckDB count (Duplicates)

AGGREGATES = {
    "expect_table_row_count_to_be_between": "sum",
    "expect_table_row_count_to_equal": "sum",
    "expect_column_max_to_be_between": "max",
    "expect_column_min_to_be_between": "min",
    "expect_table_columns_to_match_set": "same",
    "expect_table_columns_to_match_ordered_list": "same",
    "expect_table_column_count_to_equal": "same",
    "expect_table_column_count_to_be_between": "same",
    "expect_column_to_exist": "same",
    "expect_column_value_fraction_between": "fraction",
    "expect_column_sum_ratio_between": "sum_ratio",
}


@dataclass(frozen=True)
class Duplicates:
    """A uniqueness check over the whole table: rows whose non-null value occurs more than once
    (GX's rule: every occurrence counts), and the first `sample` of them in table order."""
    count: int
    sample: list


def batchable(type_: str, is_map: bool) -> bool:
    """Whether results of this expectation type merge from batches (else: validate the table whole)."""
    return type_ in AGGREGATES or type_ == UNIQUE or (is_map and type_ not in CROSS_ROW)


def merge(type_: str, kwargs: dict, results: list[dict], successes: list[bool], rows: list[int],
          partial: int, duplicates: Duplicates | None = None) -> tuple[bool, dict]:
    """(success, result) of the whole table from the batches' (result, success), in table order.

    `rows`: each batch's row count; `partial`: the result format's partial_unexpected_count.
    """
    kind = AGGREGATES.get(type_)
    if kind is None:
        return _map(kwargs, results, partial, duplicates if type_ == UNIQUE else None)
    if kind == "same":
        return all(successes), results[-1]
    observed = [r.get("observed_value") for r in results]
    if kind == "sum":
        value = sum(int(v) for v in observed if v is not None)
        ok = value == kwargs["value"] if "value" in kwargs and type_.endswith("_to_equal") else between(value, kwargs)
        return ok, {"observed_value": value}
    if kind in ("max", "min"):
        present = [v for v in observed if v is not None and not _nan(v)]
        value = (max if kind == "max" else min)(present) if present else None
        return between(value, kwargs), {"observed_value": value}
    if kind == "fraction":
        # GX computed hits / rows per batch; hits is an integer, so it is recovered exactly.
        hits = sum(round(v * n) for v, n in zip(observed, rows) if v is not None)
        total = sum(rows)
        value = float(hits) / total if total else None
        return between(value, kwargs), {"observed_value": value}
    # sum_ratio: the sums ride in the details (custom.ExpectColumnSumRatioBetween)
    total = sum(r["details"]["sum"] for r in results)
    den = sum(r["details"]["denominator_sum"] for r in results)
    num = abs(total) if kwargs.get("absolute") else total
    value = None if den == 0 else float(num) / float(den)
    return between(value, kwargs), {"observed_value": value, "details": {"sum": total, "denominator_sum": den}}


def _map(kwargs: dict, results: list[dict], partial: int, duplicates: Duplicates | None) -> tuple[bool, dict]:
    """GX's map-expectation figures over the whole table (expectation.py `_format_map_output`)."""
    element = sum(r["element_count"] for r in results)
    has_missing = "missing_count" in results[0]
    missing = sum(r["missing_count"] for r in results) if has_missing else None
    if duplicates is not None:
        unexpected, sample = duplicates.count, list(duplicates.sample)
    else:
        unexpected = sum(r["unexpected_count"] for r in results)
        sample = [v for r in results for v in r.get("partial_unexpected_list") or []]
    nonnull = element - missing if has_missing else None
    pct_total = pct_nonmissing = missing_pct = None
    if element > 0:
        pct_total = unexpected / element * 100
        if has_missing:
            missing_pct = missing / element * 100
            pct_nonmissing = unexpected / nonnull * 100 if nonnull > 0 else None
        else:
            pct_nonmissing = pct_total
    out: dict[str, Any] = {"element_count": element, "unexpected_count": unexpected,
                           "unexpected_percent": pct_nonmissing}
    if "partial_unexpected_list" in results[0]:
        out["partial_unexpected_list"] = sample[:partial]
    if has_missing:
        out.update(missing_count=missing, missing_percent=missing_pct, unexpected_percent_total=pct_total,
                   unexpected_percent_nonmissing=pct_nonmissing)
    # Vacuously true on no rows considered; else the share of good rows against `mostly`.
    considered = nonnull if has_missing else element
    mostly = kwargs.get("mostly", 1.0)
    ok = True if element == 0 or not considered else (float(considered) - float(unexpected)) / float(considered) >= mostly
    return ok, out


def between(value: Any, kwargs: dict) -> bool:
    """GX's bounds rule (expectation.py `_validate_metric_value_between`): no figure fails."""
    if value is None or _nan(value):
        return False
    lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
    above = lo is None or (value > lo if kwargs.get("strict_min") else value >= lo)
    below = hi is None or (value < hi if kwargs.get("strict_max") else value <= hi)
    return bool(above and below)


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)
