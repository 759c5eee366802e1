"""Billing reconciliation: each provider's end-token convention is measured, not assumed."""

from __future__ import annotations

from draftgate.reconstruct.billing import (
    COUNTS_END, EXCLUDES_END, BillingRow, delta, measure, residual, summary,
)


def rows(provider, pairs, eos=True):
    return [BillingRow(provider, n, billed, eos) for n, billed in pairs]


def test_delta_is_reconstructed_minus_billed_and_null_without_a_bill():
    assert (delta(10, 9), delta(10, None)) == (1, None)


def test_a_provider_that_bills_without_the_end_token_is_measured_as_excludes_end():
    data = rows("a", [(10, 9), (20, 19), (31, 30)]) + rows("b", [(10, 10), (5, 5), (7, 8)])
    conv = measure(data)
    assert (conv["a"].convention, conv["a"].agree_excludes_end, conv["a"].determined) == (EXCLUDES_END, 1.0, True)
    assert (conv["b"].convention, round(conv["b"].agree_counts_end, 3)) == (COUNTS_END, 0.667)
    s = summary(data, conv)
    assert (s["rows_billed"], s["residual_total"], round(s["row_agreement"], 3)) == (6, -1, 0.833)
    assert s["aggregate_delta_rate"] == 1 / (9 + 19 + 30 + 10 + 5 + 8)


def test_truncated_rows_cannot_tell_the_conventions_apart_and_say_so():
    conv = measure(rows("c", [(10, 10)], eos=False))
    assert (conv["c"].convention, conv["c"].determined) == (COUNTS_END, False)


def test_the_residual_only_discounts_an_end_token_that_is_there():
    assert residual(BillingRow("a", 10, 10, False), EXCLUDES_END) == 0
    assert residual(BillingRow("a", 10, 10, True), EXCLUDES_END) == -1
    assert residual(BillingRow("a", 10, None, True), EXCLUDES_END) is None
