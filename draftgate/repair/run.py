"""The repair stage's library function: the tokens table in, the repaired tokens table and the
stage's metrics out (stages/repair.py will call `run`; only it touches disk).

Rows searched: kept rows (quarantine_reason null) whose ids came from the text method. Other
rows pass through unchanged. A repaired row gets method `repaired`, its new completion ids
(input_ids, loss_mask, n_completion and billing_delta follow), and the text method's ids in
`text_ids` (the tokens schema's "text method's ids where they differ from completion_ids"), so
the tokens gate's mismatch recount and gate_repair read both. Every searched row records its
outcome in the repair_* columns (`schema()`: the tokens schema plus these).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from draftgate.config import RepairParams
from draftgate.repair.score import Sampling, Scorer
from draftgate.repair.search import Vocab, search

COLUMNS = (
    # name, arrow type name, meaning
    ("repair_status", "string", "repaired | kept (searched) | null (not searched: not the text method, or quarantined)"),
    ("repair_reason", "string", "kept: canonical | ambiguous | no_candidate | budget"),
    ("repair_no_bill", "bool_", "searched without a length constraint (no billed count or convention)"),
    ("repair_target_len", "int32", "the completion length the bill asks for under the convention"),
    ("repair_margin_runner_up", "float64", "nats: the chosen tokenization over the runner-up"),
    ("repair_margin_canonical", "float64", "nats: the chosen tokenization over the canonical encoding"),
    ("repair_candidates", "int32", "windows scored"),
    ("repair_forwards", "int32", "model passes (or engine requests) spent on the row"),
    ("repair_tokens_scored", "int32", "tokens those passes computed"),
)


def schema() -> Any:
    """The repaired tokens table: draftgate.schema.tokens() plus the repair columns (for schema.py)."""
    import pyarrow as pa

    from draftgate.schema import tokens

    s = tokens()
    for name, kind, _ in COLUMNS:
        s = s.append(pa.field(name, getattr(pa, kind)()))
    return s


@dataclass(frozen=True)
class Request:
    tokens: Any                 # pyarrow Table in draftgate.schema.tokens()
    scorer: Scorer
    vocab: Vocab
    params: RepairParams


def target_length(billed: int | None, convention: str | None, ends_with_end: bool) -> int | None:
    """The completion length the bill implies (billing.py's conventions), or None: no usable bill."""
    if billed is None or convention is None:
        return None
    return billed + (1 if convention == "excludes_end" and ends_with_end else 0)


def run(request: Request) -> tuple[Any, dict]:
    import pyarrow as pa

    p = request.params
    rows = request.tokens.to_pylist()
    counts: Counter = Counter()
    forwards = tokens_scored = candidates = 0
    for row in rows:
        for name, _, _ in COLUMNS:
            row[name] = None
        if row["quarantine_reason"] is not None or row["method"] != "text" or p.backend == "off":
            counts["not_searched"] += 1
            continue
        prompt = row["input_ids"][:row["prompt_len"]]
        canon = row["completion_ids"]
        ends = bool(canon) and canon[-1] in request.vocab.added
        target = target_length(row["billed_completion_tokens"], row["billing_convention"], ends)
        out = search(prompt, canon, target, request.scorer, request.vocab, p)
        if request.vocab.bytes_of(out.ids) != request.vocab.bytes_of(canon):
            raise AssertionError(f"row {row['prompt_id']}: the search changed the bytes (a bug in search.py)")
        counts[out.status] += 1
        counts[f"reason_{out.reason}"] += out.reason is not None
        counts["no_bill"] += out.no_bill
        forwards += out.forwards
        tokens_scored += out.tokens
        candidates += out.candidates
        row.update(repair_status=out.status, repair_reason=out.reason, repair_no_bill=out.no_bill,
                   repair_target_len=out.target_len, repair_margin_runner_up=out.margin_runner_up,
                   repair_margin_canonical=out.margin_canonical, repair_candidates=out.candidates,
                   repair_forwards=out.forwards, repair_tokens_scored=out.tokens)
        if out.status == "repaired":
            row["text_ids"] = canon
            row["completion_ids"] = out.ids
            row["input_ids"] = prompt + out.ids
            row["loss_mask"] = [0] * len(prompt) + [1] * len(out.ids)
            row["n_completion"] = len(out.ids)
            row["method"] = "repaired"
            if row["billed_completion_tokens"] is not None:
                row["billing_delta"] = len(out.ids) - row["billed_completion_tokens"]
                if row["billing_convention"] is not None:
                    row["billing_residual"] = len(out.ids) - row["repair_target_len"]
    searched = counts["repaired"] + counts["kept"]
    metrics = {
        "rows_in": len(rows), "rows_out": len(rows), "searched": searched,
        "repaired": counts["repaired"], "kept": counts["kept"], "not_searched": counts["not_searched"],
        "kept_by_reason": {k[7:]: v for k, v in sorted(counts.items()) if k.startswith("reason_") and v},
        "no_bill": counts["no_bill"],
        "ambiguous_share": counts["reason_ambiguous"] / searched if searched else 0.0,
        "forwards_per_searched_row": forwards / searched if searched else 0.0,
        "tokens_scored_per_searched_row": tokens_scored / searched if searched else 0.0,
        "candidates_per_searched_row": candidates / searched if searched else 0.0,
    }
    return pa.Table.from_pylist(rows, schema=schema()), metrics


def sampling_of(params: RepairParams, generate: Any) -> Sampling:
    """The sampler's settings: repair's own where set, else generate's request."""
    t = params.temperature if params.temperature is not None else generate.temperature
    top_p = params.top_p if params.top_p is not None else generate.top_p
    return Sampling(t, top_p, params.top_k)


def make_scorer(params: RepairParams, sampling: Sampling, hidden: Any = None) -> Scorer:
    """The backend of params.backend; `hidden` (HiddenParams) names the in-process target."""
    from draftgate.repair.score import HFScorer, SglangScorer, VllmScorer

    if params.backend == "hf":
        from draftgate.hidden.target import load_target

        target = load_target(hidden, params.device, "repair.device")
        return HFScorer(target.model, sampling, params.branch_tokens)
    if not params.base_url:
        raise ValueError(f"repair.backend {params.backend} needs repair.base_url (the engine's address)")
    cls = VllmScorer if params.backend == "vllm" else SglangScorer
    return cls(params.base_url, params.model, sampling, params.top_logprobs)
