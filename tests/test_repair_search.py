"""The search, with the real SmolLM2 target: rows the model really sampled at temperature 0.7
(bench/repair.py's demo rows, cut a few tokens after the edit), given as the model's own token
pieces. The search sees the prompt, the text's canonical encoding and the bill; the pieces only
grade it."""

from __future__ import annotations

import math

import pytest

from draftgate.config import RepairParams
from draftgate.repair.score import HFScorer, Sampling, VllmScorer, post_json
from draftgate.repair.search import (FLOOR, Vocab, Window, _best, _contenders, _copies, _log_mass, _max_marginals,
                                     _swap_terms, search, spans)
from test_repair_score import local_model

# The model wrote " trans|pose" where the text re-encodes as " transpose" (twice): canonical shorter.
TRANSPOSE = ("Write a Python one-liner that transposes a matrix given as a list of lists.", [
    "Here", "'s", " a", " one", "-", "liner", " that", " trans", "poses", " a", " matrix", " given", " as", " a",
    " list", " of", " lists", ":", "\n", "\n", "```", "python", "\n", "def", " trans", "pose", "_", "matrix"])
# "A|Test" where the text re-encodes as "AT|est": the same length, the bill cannot tell.
CAPITALISE = ("Write a JavaScript function that capitalises the first letter of a string.", [
    "Here", " is", " a", " Java", "Script", " function", " that", " capital", "izes", " the", " first", " letter",
    " of", " a", " given", " string", ":", "\n", "\n", "```", "jav", "asc", "ript", "\n", "function", " capitalize",
    "First", "Letter", "(", "str", ")", " {", "\n ", " return", " str", ".", "char", "At", "(", "0", ").", "to",
    "Upper", "Case", "()", " +", " str", ".", "slice", "(", "1", ");", "\n", "}", "\n", "```", "\n", "\n",
    "Example", " usage", ":", "\n", "\n", "```", "jav", "asc", "ript", "\n", "console", ".", "log", "(", "capital",
    "ize", "First", "Letter", "('", "This", " Is", " a", " Test", " of", " the", " Capital", " System", "'))", ";",
    " //", " Output", "s", ":", " This", "Is", "A", "Test", "Of"])
# "()|`" where the text re-encodes as "()`"; cut right after it and closed with <|im_end|>, so
# the edit touches the special token.
SQL = ("Write a SQL statement that adds a non-null column `created_at` with a default of now to a table `users`.", [
    "CREATE", " TABLE", " users", " (", "\n ", " id", " INT", " PRI", "MARY", " KEY", ",", "\n ", " created", "_",
    "at", " INT", " DEFAULT", " now", "()", "\n", ");", "\n", "```", "\n", "\n", "This", " SQL", " statement",
    " creates", " a", " table", " called", " `", "users", "`", " with", " columns", " `", "id", "`", " and", " `",
    "created", "_", "at", "`.", " The", " `", "created", "_", "at", "`", " column", " is", " created", " with", " `",
    "now", "()", "`"])

# "Car|pet" where the text re-encodes as "C|arp|et" (the demo's make repro row): canonical LONGER.
CARPET = ("Give me a short packing list for a weekend hiking trip.", [
    "A", "ru", "ba", ":", " ", "2", "5", "\n", "L", "as", " Ram", "bl", "as", ":", " ", "3", "\n", "F", "lo",
    "ats", ":", " ", "1", "2", "\n", "C", "ows", ":", " ", "1", "2", "\n", "B", "ikes", ":", " ", "1", "\n",
    "C", "aps", "ules", ":", " ", "1", "2", "\n", "Sh", "oes", ":", " ", "2", " (", "you", " can", " also",
    " pack", " ", "2", " in", " your", " carry", "-", "on", " luggage", ")", "\n", "Car", "af", "as", ":", " ",
    "1", "2", "\n", "Z", "ip", "-", "a", "-", "l", "ocks", ":", " ", "1", "2", "\n", "L", "ights", ":", " ",
    "2", "\n", "Water", "proof", ":", " ", "2", "\n", "B", "atteries", ":", " ", "2", "\n", "B", "ath",
    "rooms", ":", " ", "1", "2", "\n", "B", "if", "iber", ":", " ", "1", "2", "\n", "Car", "pet", ":", " ",
    "1", "2"])

# T 1.0 (the untuned set's row 42, cut after its second `def`): the model wrote ` trans|pose` at the
# second ` transpose`, not the first. Both edits score alike next to their own tokens; only the row
# after them tells them apart, which is where the model copies what it wrote.
COPIED = ("Write a Python function that transposes a list of equal-length lists.", [
    "A", " circular", " approach", " suff", "ills", " in", " Python", " when", " arrays", " are", " packed", ",",
    " such", " as", ":", "\n", "```", "python", "\n", "def", " transpose", "_", "cir", "cular", "(", "lists", "):",
    "\n   ", " \"\"\"", "\n   ", " Tri", "angular", " l", "att", "ices", " creation", " method", ".\"\"\"", "\n   ",
    " return", " [[", "list", "()", "]*", "[[", "list", "()", "]]", "]", "\n", "```", "\n", "\n", "M", "ers", "enne",
    " Tw", "isters", " simplify", " this", ":", "\n", "```", "python", "\n", "def", " trans", "pose", "_", "cir",
    "cular", "(", "list", "):"])

# T 1.0 (the tuning set's row 34, cut after 40 pieces; a system turn): the model wrote ` RL|I` where
# the text re-encodes as ` R|LI`, the same length. Next to its own tokens the split is 1.33 nats
# behind the canonical one, so a leading base stands; over the row it is 3.8 nats ahead (5.2 uncut),
# as the model reads the acronym on.
RIVAL = ("This loop never ends. Why?\n\ni = 0\nwhile i < 10:\n    print(i)", [
    "You", "'re", " referring", " to", " a", " Python", " feature", " called", " \"", "USE", " -", " VS", " -",
    " RL", "I", "KE", "\"", " (", "which", " stands", " for", " \"", "Use", "-", "Wrap", "-", "Interface", "-",
    "lite", " simplifies", " -", " Virtual", "L", "ite", "-", "lite", ").", " This", " feature", " allows"],
    "You review code. Point out the bug first, then show the fix.")

SAMPLING = Sampling(0.7)


@pytest.fixture(scope="module")
def lm():
    return local_model()


@pytest.fixture(scope="module")
def vocab(lm):
    from draftgate.serve.model import smollm2_tokenizer

    return Vocab.from_tokenizer(smollm2_tokenizer())


def row(lm, vocab, case, end: bool = False):
    """(prompt ids, canonical ids, the model's ids) for a pinned case (user, pieces[, system])."""
    from draftgate.serve.model import END_TOKEN, smollm2_tokenizer

    tok = smollm2_tokenizer()
    user, pieces, *system = case
    turns = [{"role": "system", "content": s} for s in system] + [{"role": "user", "content": user}]
    prompt = list(lm.tokenizer.apply_chat_template(turns, add_generation_prompt=True,
                                                   tokenize=True, return_dict=True)["input_ids"])
    truth = [vocab.by_bytes[p.encode()] for p in pieces]
    tail = [tok.token_id(END_TOKEN)] if end else []
    canon = tok.encode_ordinary(vocab.bytes_of(truth).decode()) + tail
    return prompt, canon, truth + tail


def repaired(lm, vocab, prompt, canon, target, **params):
    scorer = HFScorer(lm.model, SAMPLING)
    out = search(prompt, canon, target, scorer, vocab, RepairParams(**params))
    assert vocab.bytes_of(out.ids) == vocab.bytes_of(canon), "every candidate spells the same bytes"
    return out


def test_the_posterior_mass_sums_every_set_of_disjoint_windows_at_the_bills_length():
    import itertools
    import math

    # Six positions; windows overlap, change the length by -1, 0 or +1, one is impossible; some
    # share a span and a change of length (a shape, which the programmes step over as one).
    ws = [Window(0, 2, (1,)), Window(1, 2, (2, 3)), Window(1, 3, (4, 5, 6)), Window(3, 4, (7, 8)),
          Window(4, 6, (9,)), Window(5, 6, (10, 11)), Window(1, 3, (12, 13, 14)), Window(0, 2, (15,)),
          Window(1, 3, (16, 17, 18)), Window(3, 4, (19, 20))]
    vals = [-1.0, 0.5, -2.0, -0.25, -3.0, -math.inf, -0.5, -1.5, -4.0, -math.inf]
    for want in (-2, -1, 0, 1, 2, None):
        terms, sols = [], []
        for r in range(len(ws) + 1):
            for sol in itertools.combinations(range(len(ws)), r):
                spans_ = sorted((ws[k].start, ws[k].end) for k in sol)
                if all(a[1] <= b[0] for a, b in zip(spans_, spans_[1:])) and (
                        want is None or sum(ws[k].length_change for k in sol) == want):
                    terms.append(sum(vals[k] for k in sol))
                    sols.append((terms[-1], sol))
        finite = [t for t in terms if t > -math.inf]
        brute = math.log(sum(math.exp(t) for t in finite)) if finite else -math.inf
        assert _log_mass(6, ws, vals, want, 8) == pytest.approx(brute, abs=1e-9)
        # The same lattice's k best (the beam) are the k largest of those sums.
        for keep in (2, 3, 5):
            assert [v for v, _ in _best(6, ws, vals, want, 8, keep)] == pytest.approx(sorted(finite, reverse=True)[:keep])
        # And each window's max-marginal is the best of the sums of the sets that hold it.
        for k, got in enumerate(_max_marginals(6, ws, vals, want, 8)):
            held = [t for t, sol in sols if k in sol and t > -math.inf]
            assert got == pytest.approx(max(held)) if held else got == -math.inf


def test_a_copied_split_is_a_leaders_edit_moved_or_repeated_and_completed_to_the_bills_length():
    # The base holds ids 7 at positions 1 and 3; the leader splits the first (+1 token).
    canon = [1, 7, 2, 7, 3, 4]
    ws = [Window(1, 2, (5, 6)), Window(3, 4, (5, 6)), Window(4, 6, (8,)), Window(0, 1, (9, 9))]
    vals = [-1.0, -6.0, -2.0, -0.5]
    # At +1: the split moved to the second 7; made at both 7s it needs a -1 beside it (the merge
    # at 4-6): the programme completes the length with the best other windows it can.
    assert _copies(canon, ws, vals, [0], 1, 8) == [(1,), (0, 1, 2)]
    # A copy no split at the bill's length can hold is not offered; an impossible one neither.
    assert _copies(canon, ws, [-1.0, -6.0, -math.inf, -0.5], [0], 1, 8) == [(1,)]
    assert _copies(canon, ws, [-1.0, -math.inf, -2.0, -0.5], [0], 1, 8) == []
    # Ids that occur once have nothing to copy to.
    assert _copies(canon, ws, vals, [3], 1, 8) == []


def test_a_split_the_model_copied_is_found_where_copy_splits_asks_for_it(lm, vocab):
    prompt, canon, truth = row(lm, vocab, COPIED)
    assert len(canon) == len(truth) - 1
    scorer = HFScorer(lm.model, Sampling(1.0))
    plain = search(prompt, canon, len(truth), scorer, vocab, RepairParams())
    copies = search(prompt, canon, len(truth), scorer, vocab, RepairParams(copy_splits=True))
    assert copies.ids == truth and plain.ids != truth
    # Without the copies the search missed: the sampled split is likelier over the row than its choice.
    row_ll = lambda ids: sum(max(v, FLOOR) for v in scorer.score(prompt + ids, len(prompt)).logprobs)  # noqa: E731
    assert row_ll(truth) > row_ll(plain.ids) + 0.1      # by 0.32 nats here, 1.41 over the whole row
    assert 0.0 < copies.confidence <= copies.confidence_hi <= 1.0


def test_a_rival_of_a_leading_canonical_split_wins_over_the_row_where_rival_margin_asks_for_it(lm, vocab):
    prompt, canon, truth = row(lm, vocab, RIVAL)
    assert len(canon) == len(truth) and canon != truth      # the bill cannot tell them apart
    scorer = HFScorer(lm.model, Sampling(1.0))
    plain = search(prompt, canon, len(truth), scorer, vocab, RepairParams())
    rivals = search(prompt, canon, len(truth), scorer, vocab, RepairParams(rival_margin=1.5))
    assert (plain.status, plain.reason, plain.ids) == ("kept", "canonical", canon)
    assert (rivals.status, rivals.ids) == ("repaired", truth)
    # The canonical split it kept was a miss: the sampled one is likelier over the row.
    row_ll = lambda ids: sum(max(v, FLOOR) for v in scorer.score(prompt + ids, len(prompt)).logprobs)  # noqa: E731
    assert row_ll(truth) > row_ll(canon) + 1.0
    assert 0.5 < rivals.confidence <= rivals.confidence_hi <= 1.0
    # Its rival is re-scored over the row only where asked: a leading base stands unscored.
    assert "rescore" not in plain.phases and rivals.phases["rescore"][1] > 0


def test_a_split_scored_over_the_whole_row_counts_in_the_mass_at_that_score_not_its_windows_sum():
    import math

    # Three splits at the length, by their windows' local sums: the base (0), -1 and +2. Re-scored
    # over the whole row, the +2 one is really -3 (it lost downstream) and the -1 one is -0.5: the
    # mass is the sum of the terms with those two swapped, whichever order they come in.
    mass = math.log(1 + math.exp(-1.0) + math.exp(2.0))
    want = math.log(1 + math.exp(-0.5) + math.exp(-3.0))
    assert _swap_terms(mass, [(-3.0, 2.0), (-0.5, -1.0)]) == pytest.approx(want, abs=1e-12)
    assert _swap_terms(mass, [(-0.5, -1.0), (-3.0, 2.0)]) == pytest.approx(want, abs=1e-12)
    assert _swap_terms(mass, []) == mass and _swap_terms(-math.inf, [(0.0, 0.0)]) == -math.inf
    # Where the swapped terms are the whole mass, rounding cannot leave less than the exact terms.
    only = math.log(math.exp(30.0) + math.exp(-40.0))
    assert _swap_terms(only, [(1.0, 30.0), (-40.0, -40.0)]) == pytest.approx(math.log(math.exp(1.0) + math.exp(-40.0)))


def test_near_ties_are_settled_by_exact_scores_and_a_leading_base_stands_alone():
    best = [(0.4, (1,)), (0.3, (2,)), (0.0, ()), (-0.5, (3, 4)), (-2.0, (5,))]
    assert _contenders(best, 1.0) == [(1,), (2,), (), (3, 4)]       # within 1 nat of the best
    assert _contenders(best, 0.0) == [(1,), (2,)]                   # always the best two
    assert _contenders([(0.0, ()), (-0.1, (1,)), (-0.2, (2,))], 1.0) == [(), (1,)]  # the base leads: it stands
    leads = [(0.0, ()), (-0.1, (1,)), (-0.2, (2,)), (-2.0, (3,))]
    assert _contenders(leads, 1.0, rivals=1.5) == [(), (1,), (2,)]    # ... with its rivals where asked


def test_a_row_whose_canonical_encoding_is_shorter_than_what_the_model_sampled_is_made_exact(lm, vocab):
    prompt, canon, truth = row(lm, vocab, TRANSPOSE)
    assert len(canon) == len(truth) - 1
    out = repaired(lm, vocab, prompt, canon, len(truth))
    assert out.status == "repaired" and out.ids == truth
    # The base pass, a few branch-and-bound rounds, the exact re-scores (the winner's is the
    # second pass's base, from its first edit on), the second pass finding nothing better.
    assert out.margin_runner_up > 1.0 and out.forwards <= 12 and out.passes == 2
    # A clear choice is a confident one; over the scored windows alone it can only look surer.
    assert 0.5 < out.confidence <= out.confidence_hi <= 1.0


def test_a_row_whose_canonical_encoding_is_longer_than_what_the_model_sampled_is_made_exact(lm, vocab):
    prompt, canon, truth = row(lm, vocab, CARPET)
    assert len(canon) == len(truth) + 1
    out = repaired(lm, vocab, prompt, canon, len(truth))
    assert out.status == "repaired" and out.ids == truth and out.confidence > 0.9


def test_through_an_engines_top_k_a_split_whose_first_token_ranks_below_it_is_bounded_and_found(lm, vocab):
    from draftgate.reconstruct.classify import first_difference
    from test_repair_score import local_route, loopback

    prompt, canon, truth = row(lm, vocab, CARPET)
    at = first_difference(canon, truth)
    with loopback(local_route(lm)) as url:
        # The engine's answer over the sampled ids: `Car` is not in the top 5 it returns there.
        answer = post_json(f"{url}/v1/completions", {"prompt": prompt + truth[:at + 1], "prompt_logprobs": 5,
                                                     "max_tokens": 1})
        scorer = VllmScorer(url, lm.name, SAMPLING, top_logprobs=5)
        out = search(prompt, canon, len(truth), scorer, vocab, RepairParams(passes=1))
    assert answer["choices"][0]["prompt_logprobs"][-1][str(truth[at])]["rank"] > 5
    # Bounded by the 5th and scored exactly once it could win (it read as impossible before: kept,
    # no_candidate), the split the model sampled is found through the engine as in process.
    assert out.status == "repaired" and out.ids == truth


def test_a_same_length_re_split_is_found_although_the_bill_already_agrees(lm, vocab):
    prompt, canon, truth = row(lm, vocab, CAPITALISE)
    assert len(canon) == len(truth) and canon != truth
    out = repaired(lm, vocab, prompt, canon, len(truth))
    assert out.ids == truth and out.margin_canonical > 1.0


def test_an_edit_next_to_a_special_token_leaves_the_special_where_it_was(lm, vocab):
    prompt, canon, truth = row(lm, vocab, SQL, end=True)
    assert canon[-1] == truth[-1] and len(canon) == len(truth) - 1
    out = repaired(lm, vocab, prompt, canon, len(truth))
    assert out.ids == truth
    assert spans(out.ids, vocab)[-1][1] == len(out.ids) - 1      # the special is still last, untouched


def test_a_row_the_model_wrote_canonically_keeps_its_ids(lm, vocab):
    prompt, _, truth = row(lm, vocab, TRANSPOSE)
    cut = truth[:20]                                  # before the edit: canonical == sampled
    out = repaired(lm, vocab, prompt, cut, len(cut))
    assert out.status == "kept" and out.reason == "canonical" and out.ids == cut


def test_a_canonical_encoding_standing_in_the_first_pass_costs_the_base_pass_alone(lm, vocab):
    prompt, canon, _ = row(lm, vocab, CARPET)
    out = repaired(lm, vocab, prompt, canon[:10], 10)
    assert out.reason == "canonical" and out.passes == 1
    assert set(out.phases) == {"base"}, "nothing is scored to sharpen the confidence of a row left as it came"
    assert out.confidence < out.confidence_hi        # the unscored windows count at their bound: it errs low


def test_the_last_allowed_pass_sharpens_the_confidence_of_the_split_it_chose(lm, vocab):
    prompt, canon, _ = row(lm, vocab, TRANSPOSE)
    out = repaired(lm, vocab, prompt, canon, len(canon) + 2, passes=1)
    blunt = repaired(lm, vocab, prompt, canon, len(canon) + 2, passes=1, confidence_nats=0.0)
    assert out.status == blunt.status == "repaired" and out.ids == blunt.ids
    assert "confidence" in out.phases and "confidence" not in blunt.phases
    assert out.confidence > blunt.confidence          # windows scored near the best replace their bounds


def test_a_row_without_a_bill_is_searched_without_a_length_and_flagged(lm, vocab):
    prompt, canon, truth = row(lm, vocab, CAPITALISE)
    out = repaired(lm, vocab, prompt, canon, None)
    assert out.no_bill and out.target_len is None
    assert out.ids == truth       # the likelihood alone decides a same-length re-split


def test_an_ambiguous_choice_keeps_the_rows_ids_where_the_bill_allows_them(lm, vocab):
    prompt, canon, truth = row(lm, vocab, CAPITALISE)          # the same length: the ids may be right
    out = repaired(lm, vocab, prompt, canon, len(truth), ambiguous_margin=1e6)
    assert out.status == "kept" and out.reason == "ambiguous" and out.ids == canon
    assert out.margin_canonical is not None and out.margin_canonical < 1e6


def test_a_close_call_the_bill_rules_the_canonical_encoding_out_of_takes_the_best(lm, vocab):
    prompt, canon, truth = row(lm, vocab, TRANSPOSE)           # canonical one token short: wrong for certain
    out = repaired(lm, vocab, prompt, canon, len(truth), ambiguous_margin=1e6)
    assert out.status == "repaired" and out.ids == truth
    assert out.margin_runner_up is not None and out.margin_runner_up < 1e6     # recorded, not hidden


def test_the_batched_entry_point_gives_each_row_the_outcome_of_its_own_search(lm, vocab):
    from draftgate.repair.search import search_rows

    prompt, canon, truth = row(lm, vocab, TRANSPOSE)
    cases = [(prompt, truth[:20], truth[:20]), (prompt, canon, truth)]      # written canonically; not
    scorer = HFScorer(lm.model, SAMPLING)
    outs = list(search_rows([(p, c, len(t)) for p, c, t in cases], scorer, vocab, RepairParams()))
    assert [o.ids for o in outs] == [truth[:20], truth]                     # in the rows' order
    assert [o.reason for o in outs] == ["canonical", None]
    # One forward for both base passes (the hidden stage's batching), its cost shared.
    assert all(o.phases["base"][0] == 1 / 2 for o in outs)
    assert outs[0].phases.keys() == {"base"}          # an exact row whose bounds never beat it: no window scored


def test_a_bill_no_tokenization_can_reach_keeps_the_row_with_a_reason(lm, vocab):
    prompt, canon, _ = row(lm, vocab, TRANSPOSE)
    out = repaired(lm, vocab, prompt, canon, len(canon) + 40)
    assert out.status == "kept" and out.reason == "no_candidate" and out.ids == canon
    # +8 needs three windows at least (one changes the length by window_tokens - 1 = 3 at most);
    # a cap of one scored branch token leaves the bill out of reach: `budget`, not `no_candidate`.
    capped = repaired(lm, vocab, prompt, canon, len(canon) + 8, search_tokens=1)
    assert capped.status == "kept" and capped.reason == "budget" and capped.capped and capped.nodes == 1


def test_a_search_cut_by_the_window_cap_says_so_and_its_low_confidence_still_errs_low(lm, vocab):
    prompt, canon, truth = row(lm, vocab, TRANSPOSE)
    full = repaired(lm, vocab, prompt, canon, len(truth))
    cut = repaired(lm, vocab, prompt, canon, len(truth), search_tokens=8)
    assert not full.capped and full.ids == truth and full.nodes > 8 * full.passes   # the cap binds below the need
    # Cut before the leader was known, the search picks among the windows it scored, a split that
    # is not the sampled one, and says so; the windows it left unscored count at their bound in
    # the low estimate, which therefore calls the pick nearly hopeless (the high one, over the
    # scored windows only, does not).
    assert cut.capped and cut.status == "repaired" and cut.ids != truth
    assert cut.confidence < 0.01 < 0.9 < full.confidence <= full.confidence_hi
    assert cut.confidence_hi > 0.99


def test_the_stage_function_repairs_text_rows_and_keeps_the_text_ids_beside_them(lm, vocab):
    import pyarrow as pa

    from draftgate import schema
    from draftgate.repair.run import Request, run

    prompt, canon, truth = row(lm, vocab, TRANSPOSE)

    def tok_row(pid, method, completion):
        return {"prompt_id": pid, "input_ids": prompt + completion, "prompt_len": len(prompt),
                "completion_ids": completion, "loss_mask": [0] * len(prompt) + [1] * len(completion),
                "method": method, "n_completion": len(completion), "billed_completion_tokens": len(truth),
                "billing_convention": "counts_end", "billing_residual": len(completion) - len(truth)}
    table = pa.Table.from_pylist([tok_row("a", "text", canon), tok_row("b", "truth", truth)], schema=schema.tokens())
    result = run(Request(table, HFScorer(lm.model, SAMPLING), vocab, RepairParams()))
    a, b = result.table.to_pylist()
    metrics = result.metrics.figures
    assert (a["method"], a["completion_ids"], a["text_ids"], a["billing_residual"]) == ("repaired", truth, canon, 0)
    assert a["input_ids"] == prompt + truth and sum(a["loss_mask"]) == len(truth)
    assert b["method"] == "truth" and b["repair_status"] is None      # ids from the backend: not searched
    assert metrics["searched"] == 1 and metrics["repaired"] == 1 and metrics["not_searched"] == 1
    assert a["quarantine_reason"] is None and 0 < a["repair_confidence"] <= 1
    assert metrics["expected_made_exact"] == pytest.approx(a["repair_confidence"], abs=1e-3)
    assert a["repair_confidence"] <= a["repair_confidence_hi"] <= 1 and a["repair_capped"] is False
    assert metrics["capped"] == 0 and sum(metrics["confidence_tenths"].values()) == 1
    assert result.metrics.to_dict()["rows_in"] == 2 and result.metrics.stage == "repair"

    # A user who trains only on splits the target is sure of: above the row's confidence, the row
    # stays in the table, repaired ids and all, but out of hidden and train.
    strict = RepairParams(min_confidence=min(1.0, a["repair_confidence"] + 1e-6))
    result = run(Request(table, HFScorer(lm.model, SAMPLING), vocab, strict))
    a = result.table.to_pylist()[0]
    metrics = result.metrics.figures
    assert (a["method"], a["completion_ids"], a["quarantine_reason"]) == ("repaired", truth, "repair_low_confidence")
    assert metrics["quarantined_low_confidence"] == 1


def test_float_noise_of_another_cpu_moves_no_byte_of_the_stage_table(lm, vocab):
    """Another CPU (or thread count) sums the forward in another order: the scores move in their last
    bits (up to 1.4e-5 nats on the demo). The table stores them on coarser grids, so equal decisions
    give equal bytes and DVC reruns nothing downstream. The noise here is injected, not the machine's:
    the head's logits scaled by 1 + 1e-6."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate import schema
    from draftgate.repair.run import Request, run

    prompt, canon, truth = row(lm, vocab, TRANSPOSE)
    table = pa.Table.from_pylist([{
        "prompt_id": "a", "input_ids": prompt + canon, "prompt_len": len(prompt), "completion_ids": canon,
        "loss_mask": [0] * len(prompt) + [1] * len(canon), "method": "text", "n_completion": len(canon),
        "billed_completion_tokens": len(truth), "billing_convention": "counts_end",
        "billing_residual": len(canon) - len(truth)}], schema=schema.tokens())

    def stage() -> tuple[bytes, list[float]]:
        scored = HFScorer(lm.model, SAMPLING).score(prompt + truth, len(prompt))
        out = run(Request(table, HFScorer(lm.model, SAMPLING), vocab, RepairParams())).table
        buf = io.BytesIO()
        pq.write_table(out, buf)
        return buf.getvalue(), list(scored.logprobs)

    clean, clean_scores = stage()
    hook = lm.model.get_output_embeddings().register_forward_hook(lambda _m, _inp, logits: logits * (1 + 1e-6))
    try:
        noisy, noisy_scores = stage()
    finally:
        hook.remove()
    moved = [abs(a - b) for a, b in zip(clean_scores, noisy_scores)]
    assert 0 < max(moved) < 1e-3                       # the noise reached the target's scores ...
    assert noisy == clean                              # ... and not the table's bytes
    [r] = pq.read_table(io.BytesIO(clean)).to_pylist()
    assert r["repair_status"] == "repaired" and r["repair_margin_runner_up"] == round(r["repair_margin_runner_up"], 2)


def test_a_long_whitespace_run_stays_within_the_caps(lm, vocab):
    from draftgate.serve.model import smollm2_tokenizer

    prompt, _, _ = row(lm, vocab, TRANSPOSE)
    canon = smollm2_tokenizer().encode_ordinary("def f(x):\n" + " " * 48 + "return x")
    params = dict(window_candidates=4, search_tokens=64)
    out = repaired(lm, vocab, prompt, canon, len(canon) + 6, **params)
    assert out.nodes <= 64 * RepairParams().passes


@pytest.fixture(scope="module")
def three(lm, vocab):
    """Three pinned rows (prompt, canonical ids, bill) and each one's search alone."""
    cases = [row(lm, vocab, c, end=c is SQL) for c in (TRANSPOSE, SQL, CARPET)]
    rows = [(p, c, len(t)) for p, c, t in cases]
    return rows, [repaired(lm, vocab, p, c, n) for p, c, n in rows]


def test_a_batchs_searches_run_in_step_decide_as_each_alone_and_share_their_rounds_forwards(lm, vocab, three):
    from draftgate.repair.search import search_rows

    rows, alone = three
    scorer = HFScorer(lm.model, SAMPLING)
    together = list(search_rows(rows + rows[:1], scorer, vocab, RepairParams()))    # and a twin
    for a, b in zip(together, alone):
        assert (a.ids, a.status, a.reason, a.passes, a.nodes) == (b.ids, b.status, b.reason, b.passes, b.nodes)
        assert a.confidence == pytest.approx(b.confidence, abs=1e-3)
    assert together[3].ids == together[0].ids and together[3].phases.keys() == {"base"}   # searched once
    # In step, a round of every row is one forward: fewer than the searches alone took, together.
    assert scorer.counters.forwards < 1 + sum(sum(v[0] for k, v in o.phases.items() if k != "base") for o in alone)


def test_the_next_batchs_searches_join_the_last_of_this_ones_and_each_batchs_caches_go_when_it_ends(lm, vocab,
                                                                                                      three):
    from draftgate.repair.search import search_rows

    rows, alone = three
    # One row a batch: each next batch starts while the ones before still search (OVERLAP_ROWS).
    scorer = HFScorer(lm.model, SAMPLING, capture=([1, 2, 3], "float32"))
    handed, released = [], []
    release = scorer.release
    scorer.release = lambda keys=None: (released.append(None if keys is None else set(keys)), release(keys))
    together = list(search_rows(rows, scorer, vocab, RepairParams(batch_tokens=1), prefill=handed.append))
    for a, b in zip(together, alone):
        assert (a.ids, a.status, a.reason, a.passes, a.nodes) == (b.ids, b.status, b.reason, b.passes, b.nodes)
        assert a.confidence == pytest.approx(b.confidence, abs=1e-3)
    # The batches' rounds were shared: fewer forwards than one batch after the other took.
    assert scorer.counters.forwards < sum(o.forwards for o in alone)
    # Each batch handed its kept rows' features on once, then let its own caches go as it ended.
    assert sorted(len(h) for h in handed) == sorted(int(o.status != "repaired") for o in together)
    assert all(f is not None for h in handed for _, f in h)
    assert len(released) == 4 and [sum(tuple(p) + tuple(c) in keys for keys in released[:3]) for p, c, _ in rows] == [1] * 3
    assert released[3] is None and not scorer._rows and not scorer._pending and not scorer._features


def test_each_later_pass_starts_from_the_scores_a_fresh_pass_over_its_ids_gives(lm, vocab, monkeypatch):
    # The winner is re-scored only from its first edit on; before it the base's scores and
    # alternatives are reused. Every later pass's base must still be what a full pass would give.
    from draftgate.repair import search as module
    from draftgate.repair.search import alternatives

    bases = []
    inner = module._pass

    def recorded(prompt, canon, scored, *rest, **kw):
        bases.append((list(canon), scored))
        return (yield from inner(prompt, canon, scored, *rest, **kw))

    monkeypatch.setattr(module, "_pass", recorded)
    prompt, canon, truth = row(lm, vocab, TRANSPOSE)
    out = repaired(lm, vocab, prompt, canon, len(truth))
    assert out.status == "repaired" and len(bases) >= 2
    for ids, scored in bases[1:]:
        fresh = HFScorer(lm.model, SAMPLING).score(prompt + ids, len(prompt), alternatives(ids, vocab))
        assert scored.logprobs == pytest.approx(fresh.logprobs, abs=1e-4)
        assert [sorted(a) for a in scored.asked] == [sorted(a) for a in fresh.asked]
        assert [v for a in scored.asked for v in a.values()] == pytest.approx(
            [v for a in fresh.asked for v in a.values()], abs=1e-4)
