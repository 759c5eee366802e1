"""Batch reconstruction: response rows + prompt rows -> tokens rows (draftgate.schema.tokens()).

Per row (Python, cheap): normalise the provider's output, render the completion into segments;
per prompt, however many responses share it: parse, render, encode, prefix verdict once. Per
batch (the tokenizer's native core): one `encode_ordinary_batch` over every distinct text of the
batch (templates/encode.py Pieces), one special-parsing encode for the prefix check. Then per row:
choose the ids (truth > logprobs > text, or text when forced), classify the text method against
the reference ids, flags, billing, quarantine.

Prompt ids: with an official template (a model directory, official.py) they are the serving
engine's: the official render encoded with added tokens parsed; else the template as code,
encoded by segments. The code template still renders every prompt, and rows where the two texts
differ are counted (the contract proves equality only on its probe set).

Quarantined rows stay in the output with `quarantine_reason` set; kept rows have it null.
"""

from __future__ import annotations

import functools
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from draftgate.reconstruct import billing, billing_prefill, prefix
from draftgate.reconstruct.classify import compare, first_difference
from draftgate.reconstruct.degenerate import repetition, tenth
from draftgate.reconstruct.flags import Markers, flags, prompt_think_open
from draftgate.reconstruct.logprobs import BytesIndex
from draftgate.reconstruct.normalise import Dialect, normalise
from draftgate.provider_rules import apply_rules
from draftgate.templates.base import Text

EXAMPLES = 5  # prompt ids kept per quarantine reason in the metrics, for review
PROMPT_IDS = "_prompt_ids"   # row key of reconstruct(joined=False); not a tokens column
PROMPT_EXACT = "_prompt_exact"  # row key: the backend returned prompt ids equal to ours


class ReconstructError(ValueError):
    """Inputs the stage cannot work with at all (as opposed to one bad row: a quarantine)."""


@dataclass(frozen=True)
class Setup:
    tok: Any                        # draftgate.tokenizers.Tokenizer
    template: Any                   # draftgate.templates.ChatTemplate
    special_ids: Mapping[str, int]  # from the contract, never literals
    thinking: bool
    method: str = "auto"            # auto | text
    official: Any = None            # official.OfficialTemplate: prompts as the engine renders them
    request_rules: tuple[str, ...] = ()   # provider_rules.py: what providers change before templating
    # reconstruct.max_repetition: a completion whose seq-rep-4 is above it is quarantined as
    # `degenerate` (degenerate.py); 1.0 keeps every row.
    max_repetition: float = 1.0
    # reconstruct.billing.prefill resolved (billing_prefill.resolve): per provider (lower-cased),
    # the ids it appends to the generation prompt; they move from the completion to the prompt.
    prefill: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class Result:
    rows: list[dict]
    counts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def quarantine(self, row: dict, reason: str, detail: str = "") -> None:
        row["quarantine_reason"] = reason
        self.counts["quarantine"][reason] += 1
        if len(self.examples[reason]) < EXAMPLES:
            self.examples[reason].append(f"{row['prompt_id']}: {detail}" if detail else row["prompt_id"])


def markers(setup: Setup) -> Markers:
    ids, t = setup.special_ids, setup.template
    missing = sorted(set(t.special_names) - set(ids))
    if missing:
        raise ReconstructError(
            f"the contract has no ids for {', '.join(missing)} (template {t.name}); rerun the "
            "contract stage with this template so that every special name is resolved")
    # The same roles the contract records for the gates (one derivation of them).
    from draftgate.templates.roles import template_roles

    r = template_roles(t, ids)
    return Markers(end=r["end_id"],
                   think=(r["think_open"], r["think_close"]) if r["think_open"] is not None else None,
                   tool_pairs=tuple(tuple(p) for p in r["tool_pairs"]),
                   think_implicit_close=frozenset(r["think_implicit_close"]))


def reconstruct(responses: Sequence[Mapping[str, Any]], prompts: Mapping[str, Mapping[str, Any]],
                setup: Setup, index: BytesIndex | None = None, joined: bool = True) -> Result:
    """`joined=False` (the table's way): a row gets its prompt's ids under PROMPT_IDS (one list
    shared by the prompt's rows) instead of `input_ids` and `loss_mask` lists of its own."""
    from draftgate.templates import Completion, TemplateError, ToolCall
    from draftgate.templates.base import render_text
    from draftgate.templates.encode import Pieces

    tmpl, m = setup.template, markers(setup)
    out = Result([_empty_row(r, prompts.get(r["prompt_id"])) for r in responses])
    pieces = Pieces(setup.special_ids)
    by_prompt: dict[str, _Prompt] = {}
    literal = prefix.added_tokens_pattern(setup.tok)
    official: list[_Prompt] = []   # prompts rendered by the official template, in order

    # 1. Normalise and render (per row, pure Python); each prompt once, however many responses
    #    share it. Every text of the batch is planned into `pieces`.
    work = []  # (row index, prompt, completion segments, completion plan, normalised)
    for i, (r, row) in enumerate(zip(responses, out.rows)):
        pid = r["prompt_id"]
        # Per dataset, every response: the length-truncated rate the metrics report.
        out.counts["responses_by_dataset"][str(row["dataset"])] += 1
        if r.get("finish_reason") == "length":
            out.counts["length_by_dataset"][str(row["dataset"])] += 1
        pr = by_prompt.get(pid)
        if pr is None:
            pr = by_prompt[pid] = _Prompt(prompts.get(pid), tmpl, setup.request_rules)
        if pr.bad is not None:
            out.quarantine(row, *pr.bad)
            continue
        n = normalise(r if type(r) is dict else dict(r), pr.dialect)
        if n.normalisations:    # else the row keeps its "[]"
            row["normalisations"] = json.dumps(list(n.normalisations))
            out.counts["normalisations"].update(n.normalisations)
        if n.quarantine:
            out.quarantine(row, n.quarantine, r.get("failure_reason") or "")
            continue
        c = n.parts
        think_closed = _think_closed(tmpl, c, r, setup.special_ids, row, out)
        completion = Completion(reasoning=c.reasoning, content=c.content,
                                tool_calls=tuple([ToolCall(t.name, t.arguments, t.id) for t in c.tool_calls]),
                                truncated=c.truncated, think_closed=think_closed)
        if pr.segments is None and pr.template_error is None:
            pr.render(setup, pieces, literal, out)
            if pr.official_text is not None:
                official.append(pr)
        if pr.template_error is not None:
            out.quarantine(row, "template_error", pr.template_error)
            continue
        try:
            cseg = tmpl.render_completion(completion, pr.mode(setup))
        except TemplateError as e:
            out.quarantine(row, "template_error", str(e))
            continue
        work.append((i, pr, cseg, pieces.plan(cseg, pid), n))

    # 2. Encode every distinct text of the batch at once; specials by the contract's ids. Official
    #    renders are encoded as the engine does (added tokens parsed), also in one call.
    pieces.encode(setup.tok)
    if official:
        engine_ids = setup.tok.encode_batch([pr.official_text for pr in official])
        tails = setup.tok.encode_ordinary_batch([pr.tail for pr in official])
        for pr, ids, tail in zip(official, engine_ids, tails):
            pr.ids, pr.last_len = ids, len(tail) if pr.tail else 0
            pr.think_open = prompt_think_open(ids, m)

    # 3. Prefix check (prefix.py): one special-parsing encode of every row's boundary.
    windows, at = [], {}
    for k, (_, pr, cseg, _, _) in enumerate(work):
        w = prefix.window(pr.segments, cseg)
        if w is not None:
            at[k] = len(windows)
            windows.append(w)
    engine = prefix.encode_with_specials(setup.tok, windows)

    # Text is encoded by an ordinary encoder built without the added vocabulary, so no added
    # token's id can come out of it (draftgate/tokenizers; fuzz-tested there). What can: a contract id
    # that is an ordinary token (the 163533 "chas" bug). Only those are looked for.
    added = frozenset(getattr(setup.tok, "added_ids", ()))
    special_set = frozenset(i for i in setup.special_ids.values() if i not in added)
    marker_ids = m.all_ids
    vocab = setup.tok.vocab_size
    parts, n_special = pieces.pieces, pieces.n_special
    for k, (i, pr, cseg, plan, n) in enumerate(work):
        r, row = responses[i], out.rows[i]
        if pr.ids is None:
            pr.finish(pieces, literal, special_set, m)
        prompt_ids, text_ids = pr.ids, pieces.ids(plan)
        think_open = pr.think_open
        pre = setup.prefill.get(billing.provider_key(r.get("provider"))) if setup.prefill else None
        if pre is not None:
            # The provider prefilled the generation prompt (billing_prefill.py): those ids were the
            # prompt's, the completion it returned starts after them.
            moved = billing_prefill.split(prompt_ids, text_ids, pre)
            if moved is None:
                out.quarantine(row, "prefill_absent",
                               f"reconstruct.billing.prefill declares {list(pre)} for provider {r.get('provider')!r} "
                               f"but the rendered completion starts {text_ids[:len(pre)]}")
                continue
            prompt_ids, text_ids = moved
            think_open = prompt_think_open(prompt_ids, m)
        row["special_in_text"] = pr.special_in_text or _special_in_text(plan, pieces, special_set)
        unstable = pr.literal or (prefix.boundary_merge(prompt_ids, pr.last_len, engine[at[k]])
                                  if k in at else None)

        reference, source = _reference(r, cseg, text_ids, m.end, setup, index, out, render_text, pre or ())
        if reference is not None and reference and not 0 <= min(reference) <= max(reference) < vocab:
            out.quarantine(row, f"{source}_ids_outside_vocabulary",
                           f"ids {min(reference)}..{max(reference)}, vocabulary 0..{vocab - 1}")
            continue
        if setup.method == "text" or source is None:
            final, method = text_ids, "text"
        else:
            final, method = list(reference), source
        out.counts["method"][method] += 1
        cmp = compare(text_ids, reference, setup.tok.token_bytes)
        out.counts["match"][cmp.match] += 1
        if cmp.first_diff is not None:
            out.counts["differing_tokens"]["text"] += cmp.span[0]
            out.counts["differing_tokens"]["reference"] += cmp.span[1]

        markers_seen = None
        if final is text_ids and not row["special_in_text"] and pre is None:
            # The plan says where the specials are: no need to scan the ids for markers.
            markers_seen = [parts[x][0] for x in plan if x < n_special and parts[x][0] in marker_ids]
        f = flags(final, prompt_ids, n.parts.truncated, m, markers_seen, think_open)
        row.update(
            prompt_len=len(prompt_ids), completion_ids=final, method=method, match=cmp.match,
            first_diff=cmp.first_diff, diff_context=cmp.context, n_completion=len(final),
            # The text method's ids where they are not the row's ids: the tokens gate recomputes
            # the mismatch rate from them and the backend's truth ids.
            text_ids=None if final is text_ids or final == text_ids else text_ids,
            billing_delta=billing.delta(len(final), row["billed_completion_tokens"]),
            ends_with_eos=f.ends_with_eos, think_balanced=f.think_balanced,
            tool_markers_balanced=f.tool_markers_balanced,
        )
        if joined:
            row["input_ids"] = prompt_ids + final
            row["loss_mask"] = [0] * len(prompt_ids) + [1] * len(final)
        else:
            row[PROMPT_IDS] = prompt_ids    # table.to_arrow joins them, in numpy
        served = r.get("prompt_token_ids")   # vLLM's return_token_ids; the local server's too
        row["prompt_source"] = "official" if pr.official_text is not None else "code"
        row[PROMPT_EXACT] = served is not None and list(served) == prompt_ids
        if served is not None and list(served) != prompt_ids:
            j = first_difference(prompt_ids, served)
            out.quarantine(row, "prompt_ids_differ",
                           f"the backend's prompt ids differ from the rendered prompt's at {j}: "
                           f"{list(served[j:j + 4])} vs {prompt_ids[j:j + 4]}")
        elif unstable:
            out.quarantine(row, "prefix_unstable", unstable)
        elif not f.ends_with_eos and not n.parts.truncated:
            out.quarantine(row, "no_end_token", f"{method} ids end with {final[-1:]}")
        elif not f.think_balanced:
            out.quarantine(row, "think_unbalanced", method)
        elif not f.tool_markers_balanced:
            out.quarantine(row, "tool_markers_unbalanced", method)
        rep = repetition(final)
        out.counts["repetition"][tenth(rep)] += 1
        if rep > setup.max_repetition and row["quarantine_reason"] is None:
            out.quarantine(row, "degenerate", f"seq-rep-4 {rep:.3f} > reconstruct.max_repetition "
                                              f"{setup.max_repetition}")
    return out


class _Prompt:
    """One prompt's share of the work, done once for all the responses to it: parsed (here),
    rendered and planned (by the first response that gets that far), then its ids and prefix
    verdict (`finish`, after the batch is encoded)."""

    # Defaults on the class: an instance sets only what it learns (one per prompt of the batch).
    bad: tuple[str, str] | None = None     # (quarantine reason, detail) for every response to it
    messages: Any = None
    tools: Any = None
    dialect: Dialect | None = None
    segments: list | None = None
    template_error: str | None = None
    plan: list[int] | None = None
    ids: list[int] | None = None
    last_len = 0                            # ids of the last segment, when it is text
    literal: str | None = None              # why prefix-unstable: an added token's text in it
    special_in_text = False
    think_open = False
    thinking: bool | None = None            # the prompt's own serving mode (prompts.parquet); None: Setup's
    official_text: str | None = None        # the official render, when there is an official template
    tail = ""                               # its text after the last added token

    def __init__(self, p: Mapping[str, Any] | None, tmpl: Any, rules: Sequence[str] = ()):
        if p is None:
            self.bad = ("prompt_missing", "not in the prompts table")
            return
        self.thinking = p.get("thinking")
        try:
            self.messages = json.loads(p["messages"])
            self.tools = apply_rules(json.loads(p["tools"]) if p.get("tools") else None, rules)
        except json.JSONDecodeError as e:
            self.bad = ("prompt_unparseable", str(e))
            return
        self.dialect = _dialect(tmpl, self.messages)

    def render(self, setup: Setup, pieces: Any, literal: Any, out: Result) -> None:
        """Code render always; the official one too when the target has it (then its ids win)."""
        from draftgate.official import OfficialTemplateError
        from draftgate.templates import TemplateError
        from draftgate.templates.base import render_text

        tmpl = setup.template
        try:
            code = tmpl.render_prompt(self.messages, self.tools, self.mode(setup))
        except TemplateError as e:
            self.template_error = str(e)
            return
        if setup.official is None:
            self.segments = code
            self.plan = pieces.plan(code, "prompt")
            return
        try:
            text = setup.official.render(self.messages, self.tools, tmpl.jinja_kwargs(self.mode(setup)))
        except OfficialTemplateError as e:
            self.template_error = str(e)
            return
        self.official_text = text
        out.counts["prompt_render"]["official_equals_code" if render_text(code) == text
                                    else "official_differs_from_code"] += 1
        # The engine's view: text split at every added token; only the last text matters to the
        # prefix check, and no literal check applies (the engine's parse IS the prompt).
        parts = literal.split(text) if literal is not None else [text]
        self.tail = parts[-1]
        self.segments = [Text(parts[-1])] if parts[-1] else []

    def mode(self, setup: Setup) -> bool:
        """Thinking on or off for this prompt: its own (prompts.thinking), else template.thinking."""
        return setup.thinking if self.thinking is None else bool(self.thinking)

    def finish(self, pieces: Any, literal: Any, special: frozenset[int], m: Markers) -> None:
        if self.official_text is not None:
            return          # ids, last_len and think_open were set from the engine's encode
        self.ids = pieces.ids(self.plan)
        self.think_open = prompt_think_open(self.ids, m)
        last = self.plan[-1] if self.plan else None
        self.last_len = len(pieces.pieces[last]) if last is not None and last >= pieces.n_special else 0
        self.literal = prefix.literal_in_prompt(self.segments, literal)
        self.special_in_text = _special_in_text(self.plan, pieces, special)


def _dialect(tmpl: Any, messages: list[dict]) -> Dialect:
    if tmpl.family != "kimi":
        # Only Kimi numbers tool calls across the conversation; the others share one dialect.
        return _plain_dialect(tmpl.think_tokens)
    from draftgate.templates.kimi_k2 import kimi_tool_call_id

    prior = sum(len(m.get("tool_calls") or []) for m in messages if isinstance(m, dict))
    return Dialect(think=tmpl.think_tokens, tool_id=kimi_tool_call_id, first_tool_index=prior)


@functools.lru_cache(maxsize=None)
def _plain_dialect(think: tuple[str, str] | None) -> Dialect:
    return Dialect(think=think)


def _think_closed(tmpl: Any, c: Any, r: Mapping[str, Any], ids: Mapping[str, int], row: dict,
                  out: Result) -> bool:
    # Kimi-K2 sometimes runs from reasoning straight into tool calls without `</think>`. The
    # provider's split cannot show it; the truth ids can. Without truth: render as the template
    # does by default (closed), and the comparison, where possible, tells.
    if not (tmpl.family == "kimi" and c.reasoning and c.tool_calls and not c.content):
        return True
    truth = r.get("truth_ids")
    if truth is None or ids[tmpl.think_tokens[1]] in truth:
        return True
    done = json.loads(row["normalisations"]) + ["kimi_think_unclosed"]
    row["normalisations"] = json.dumps(done)
    out.counts["normalisations"]["kimi_think_unclosed"] += 1
    return False


def _reference(r: Mapping[str, Any], cseg: list, text_ids: list[int], end_id: int, setup: Setup,
               index: BytesIndex | None, out: Result, render_text: Any, prefill: Sequence[int] = ()
               ) -> tuple[Sequence[int] | None, str | None]:
    """The ids the model produced, when the backend told us: truth ids, else logprob bytes."""
    truth = r.get("truth_ids")
    if truth is not None:
        return list(truth), "truth"
    if not r.get("logprobs"):
        return None, None
    if index is None:
        out.counts["logprobs_fallback"]["no_index"] += 1
        return None, None
    look = index.lookup(r["logprobs"])
    if look.ids is None:
        out.counts["logprobs_fallback"][look.reason] += 1
        return None, None
    # The logprobs must cover the whole completion (some providers give content only): their
    # bytes must be the rendered completion's bytes, the end token allowed to be absent.
    got = b"".join(setup.tok.token_bytes(i) for i in look.ids)
    want = render_text(cseg).encode("utf-8")
    if prefill:   # the prompt's now (billing_prefill.py): the provider's logprobs start after it
        want = want.removeprefix(b"".join(setup.tok.token_bytes(i) for i in prefill))
    ids = list(look.ids)
    if got != want:
        end = setup.tok.token_bytes(end_id)
        if want.endswith(end) and got == want[:-len(end)]:
            ids.append(end_id)
        else:
            out.counts["logprobs_fallback"]["logprobs_incomplete"] += 1
            return None, None
    return ids, "logprobs"


def _special_in_text(plan: list[int], pieces: Any, special: frozenset[int]) -> bool:
    # A text piece holding a contract id: each text's ids are its own piece of the plan.
    if not special:
        return False
    parts, n = pieces.pieces, pieces.n_special
    return any(k >= n and not special.isdisjoint(parts[k]) for k in plan)


def _empty_row(r: Mapping[str, Any], p: Mapping[str, Any] | None) -> dict:
    from draftgate.config import mode_name

    thinking = (p or {}).get("thinking")
    return {
        "prompt_id": r["prompt_id"], "dataset": r.get("dataset") or (p or {}).get("dataset"),
        "split": (p or {}).get("split"), "thinking": thinking,
        # The label, for reports; the composition gate recomputes the mode from the ids.
        "mode": None if p is None or thinking is None else mode_name(bool(thinking), bool(p.get("tools"))),
        "input_ids": None, "prompt_len": None,
        "completion_ids": None, "loss_mask": None, "method": None, "match": None,
        "first_diff": None, "diff_context": None, "n_completion": None,
        "billed_completion_tokens": r.get("billed_completion_tokens"), "billing_delta": None,
        "billing_convention": None, "billing_residual": None,
        "billed_prompt_tokens": r.get("billed_prompt_tokens"), "prompt_billing_offset": None,
        "prompt_billing_residual": None, "prompt_source": None, "text_ids": None, PROMPT_EXACT: False,
        "finish_reason": r.get("finish_reason"), "provider": r.get("provider"),
        "ends_with_eos": None, "think_balanced": None, "tool_markers_balanced": None,
        "special_in_text": None, "normalisations": "[]", "quarantine_reason": None,
    }
