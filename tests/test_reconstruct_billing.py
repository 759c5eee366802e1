"""Billing reconciliation: conventions are declared or learned from exact rows, never fitted on
the rows being graded, and the best fit is reported beside them."""

from __future__ import annotations

from draftgate.reconstruct.billing import (
    COUNTS_END, EXCLUDES_END, LEARN, BillingRow, declared, delta, prompt_residual, residual, settle, summary,
)

ANY_LEARN = {"*": LEARN}


def rows(provider, pairs, eos=True, exact=False):
    return [BillingRow(provider, n, billed, eos, exact=exact) for n, billed in pairs]


def test_delta_is_reconstructed_minus_billed_and_null_without_a_bill():
    assert (delta(10, 9), delta(10, None)) == (1, None)


def test_a_convention_learned_from_exact_rows_grades_the_text_rows():
    exact = rows("a", [(10, 9), (20, 19)], exact=True)       # truth ids: the provider excludes the end
    text = rows("a", [(31, 30), (12, 11)])
    conv = settle(exact + text, ANY_LEARN, ANY_LEARN)["a"]
    assert (conv.completion, conv.completion_source, conv.completion_learned_from) == (EXCLUDES_END, "learned", 2)
    assert (conv.completion_best_fit, conv.completion_agrees) == (EXCLUDES_END, True)
    s = summary(exact + text, {"a": conv})
    assert (s["completion"]["rows"], s["completion"]["row_agreement"], s["disagreements"]) == (4, 1.0, [])


def test_a_systematic_off_by_one_is_not_absorbed_by_switching_conventions():
    # Truth rows say counts_end; every text row ending with the end token is one token long.
    exact = rows("a", [(10, 10), (20, 20)], exact=True)
    text = rows("a", [(31, 30), (12, 11), (40, 39), (8, 7), (9, 8)])
    conv = settle(exact + text, ANY_LEARN, ANY_LEARN)["a"]
    assert conv.completion == COUNTS_END and conv.completion_best_fit == EXCLUDES_END
    assert conv.completion_agrees is False
    s = summary(exact + text, {"a": conv})
    assert s["completion"]["row_agreement"] == 2 / 7 and s["completion"]["residual_total"] == 5
    assert s["disagreements"] == ["a: completion counts_end (learned) but best fit excludes_end"]


def test_a_declared_convention_wins_over_learning_and_is_still_checked_against_the_best_fit():
    data = rows("OpenRouter", [(10, 9), (20, 19)])            # no exact rows: nothing to learn from
    conv = settle(data, {"openrouter": COUNTS_END}, ANY_LEARN)["openrouter"]
    assert (conv.completion, conv.completion_source, conv.completion_agrees) == (COUNTS_END, "declared", False)


def test_without_exact_rows_or_a_declaration_the_convention_is_unknown_and_named():
    conv = settle(rows("x", [(10, 9)]), ANY_LEARN, ANY_LEARN)
    assert (conv["x"].completion, conv["x"].completion_source) == (None, "unknown")
    s = summary(rows("x", [(10, 9)]), conv)
    assert s["unknown_completion"] == ["x"] and s["completion"]["rows"] == 0


def test_truncated_rows_cannot_tell_the_conventions_apart():
    conv = settle(rows("c", [(10, 10)], eos=False, exact=True), ANY_LEARN, ANY_LEARN)["c"]
    assert (conv.completion, conv.completion_best_fit) == (None, None)


def test_the_residual_only_discounts_an_end_token_that_is_there():
    assert residual(BillingRow("a", 10, 10, False), EXCLUDES_END) == 0
    assert residual(BillingRow("a", 10, 10, True), EXCLUDES_END) == -1
    assert residual(BillingRow("a", 10, None, True), EXCLUDES_END) is None
    assert residual(BillingRow("a", 10, 10, True), None) is None


def prompt_rows(provider, pairs, exact=False):
    return [BillingRow(provider, 1, None, True, prompt_len=n, billed_prompt=b, prompt_exact=exact)
            for n, b in pairs]


def test_the_prompt_offset_is_learned_from_rows_whose_prompt_ids_the_backend_returned():
    data = prompt_rows("local", [(20, 21), (30, 31)], exact=True) + prompt_rows("local", [(5, 6)])
    conv = settle(data, ANY_LEARN, ANY_LEARN)["local"]
    assert (conv.prompt_offset, conv.prompt_source, conv.prompt_learned_from) == (1, "learned", 2)
    assert summary(data, {"local": conv})["prompt"]["row_agreement"] == 1.0


def test_a_default_system_turn_inserted_by_mistake_shows_as_prompt_residuals():
    # Declared offset 0; our prompts carry 12 extra tokens the provider never rendered.
    data = prompt_rows("moonshotai", [(32, 20), (81, 69), (122, 110)])
    conv = settle(data, ANY_LEARN, {"*": 0})["moonshotai"]
    s = summary(data, {"moonshotai": conv})
    assert s["prompt"]["row_agreement"] == 0.0 and s["prompt"]["residual_total"] == 36
    assert conv.prompt_best_fit == -12 and conv.prompt_agrees is False


def test_params_entries_match_providers_case_insensitively_with_a_star_fallback():
    table = {"Novita": 0, "*": 1}
    assert (declared(table, "novita"), declared(table, "DeepInfra"), declared({}, "x")) == (0, 1, LEARN)
    assert prompt_residual(BillingRow("a", 1, None, True, prompt_len=10, billed_prompt=11), 1) == 0
