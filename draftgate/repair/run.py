"""The repair stage's library function: the tokens table in, the repaired tokens table and the
stage's StageMetrics out (`Result`; stages/repair.py opens the inputs with `opened`, calls
`run`, writes both).

Rows searched: kept rows (quarantine_reason null) whose ids came from the text method. Other
rows pass through unchanged. A repaired row gets method `repaired`, its new completion ids
(input_ids, loss_mask, n_completion and billing_delta follow), and the text method's ids in
`text_ids` (the tokens schema's "text method's ids where they differ from completion_ids"), so
the tokens gate's mismatch recount and gate_repair read both. Every searched row records its
outcome in the repair_* columns (`schema()`: the tokens schema plus these). A repaired row whose
confidence is below repair.min_confidence is quarantined (`repair_low_confidence`): it stays in the
table, out of hidden and train. A row whose search repair.search_tokens cut says so
(`repair_capped`), whatever its outcome, and the metrics count them (`capped`).

With a prefill (`Request.prefill`: the in-process target, or an engine repair started with the
hidden backend's settings, repair/engine.py), the base pass also captures the hidden stage's
features, and the rows whose search kept their ids are written to it batch by batch
(draftgate/prefill.py; docs/repair.md, "One prefill for two stages").
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from draftgate.config import RepairParams
from draftgate.repair.score import Sampling, Scorer
from draftgate.repair.search import Vocab, search_rows

COLUMNS = (
    # name, arrow type name, meaning
    ("repair_status", "string", "repaired | kept (searched) | null (not searched: not the text method, or quarantined)"),
    ("repair_reason", "string", "kept: canonical | ambiguous | no_candidate | budget"),
    ("repair_capped", "bool_", "the search was cut by repair.search_tokens: windows that could have entered the "
                               "contenders went unscored (the choice may be a search miss; confidence counts them at their bound)"),
    ("repair_no_bill", "bool_", "searched without a length constraint (no billed count or convention)"),
    ("repair_target_len", "int32", "the completion length the bill asks for under the convention"),
    ("repair_margin_runner_up", "float64", "nats (to 0.01): the chosen tokenization over the runner-up"),
    ("repair_margin_canonical", "float64", "nats (to 0.01): the chosen tokenization over the canonical encoding"),
    ("repair_confidence", "float64", "the choice's posterior among every split of the text at the length (errs low; to 0.001)"),
    ("repair_confidence_hi", "float64", "the same over the scored windows only (errs high; to 0.001)"),
    ("repair_candidates", "int32", "windows scored"),
    # Fractional: a batched first pass is shared out over its rows (search.search_rows).
    ("repair_forwards", "float64", "model passes (or engine requests) spent on the row"),
    ("repair_tokens_scored", "float64", "tokens those passes computed"),
)


# The scores are stored rounded to a grid far coarser than the forward's own float noise, so that a
# table whose decisions are equal has equal bytes on any CPU and thread count, and DVC reruns nothing
# downstream of it. Measured on the demo (118 searched rows, torch on 1 vs 2 threads, one AMD EPYC):
# margins moved by up to 1.4e-5 nats (6e-7 relative: float32 sums of log-probabilities), confidences
# by up to 7.6e-8. A value crosses a boundary of its grid with probability |move| / grid: summed over
# the table, 9.4e-5 / 0.01 + 1.7e-7 / 0.001 = 0.0096 expected crossings, so about one rerun in a
# hundred on another machine rewrites the table (then hidden and what follows rerun, as before). The
# grids are finer than anything the stage decides on (rescore_margin 1 nat, confidence_nats 4) or a
# reader compares (calibration in tenths). docs/reproducibility.md says what a user sees.
MARGIN_DECIMALS = 2          # nats
# Kept in metrics/repair.details.json, out of the metric DVC prints: the histogram's ten bins.
DETAILS_ONLY = ("confidence_tenths",)
CONFIDENCE_DECIMALS = 3


def _stored(x: float | None, decimals: int) -> float | None:
    return None if x is None else round(x, decimals)


def schema() -> Any:
    """The repaired tokens table: draftgate.schema.tokens() plus the repair columns (for schema.py)."""
    import pyarrow as pa

    from draftgate.schema import tokens

    s = tokens()
    for name, kind, _ in COLUMNS:
        s = s.append(pa.field(name, getattr(pa, kind)()))
    return s


class RepairError(ValueError):
    """The stage cannot repair; the message names the input or param and the fix."""


@dataclass(frozen=True)
class Request:
    tokens: Any                 # pyarrow Table in draftgate.schema.tokens()
    scorer: Scorer
    vocab: Vocab
    params: RepairParams
    truth: dict[str, list[int]] | None = None   # prompt id -> the backend's own ids: grading only
    progress: Any = None                         # called (rows done, rows, counts) now and then
    prefill: Any = None                          # prefill.PrefillWriter: run() adds the kept rows, closes it
    prefill_skipped: str | None = None           # why the base pass keeps no features (prefill_skipped())


def target_length(billed: int | None, convention: str | None, ends_with_eos: bool) -> int | None:
    """The completion length the bill implies, or None: no usable bill. billing.residual's rule
    turned around: under excludes_end a completion that ends with the end token is one longer."""
    from draftgate.reconstruct.billing import EXCLUDES_END

    if billed is None or convention is None:
        return None
    return billed + (1 if convention == EXCLUDES_END and ends_with_eos else 0)


@dataclass(frozen=True)
class Result:
    table: Any              # pyarrow Table in schema()
    metrics: Any            # draftgate.metrics.StageMetrics


def run(request: Request) -> Result:
    import pyarrow as pa

    from draftgate.config import as_dict
    from draftgate.metrics import StageMetrics

    p = request.params
    rows = request.tokens.to_pylist()
    counts: Counter = Counter()
    forwards = tokens_scored = candidates = 0
    expected = expected_hi = 0.0   # the repaired rows' summed confidences: made exact, expected (low, high)
    tenths = [0] * 10              # the repaired rows' confidences (low estimate) in tenths
    phases: dict[str, list[float]] = {}

    def searchable(row: dict) -> bool:
        return row["quarantine_reason"] is None and row["method"] == "text" and p.backend != "off"

    def triple(row: dict) -> tuple[list[int], list[int], int | None]:
        return (row["input_ids"][:row["prompt_len"]], row["completion_ids"],
                target_length(row["billed_completion_tokens"], row["billing_convention"], bool(row["ends_with_eos"])))

    # One batched first pass for every searched row (the hidden stage's batching), then each
    # row's search on its own slice of it; outcomes come back in row order. The rows a batch's
    # search kept go to the prefill with the features of that same pass.
    searched = [(r["prompt_id"], triple(r)) for r in rows if searchable(r)]
    prefill_s = 0.0

    def keep(batch: list[tuple[int, Any]]) -> None:
        nonlocal prefill_s
        start = time.perf_counter()
        # An engine's features are read here, once its file is written (repair/engine.py).
        stored = [(searched[i], f() if callable(f) else f) for i, f in batch if f is not None]
        request.prefill.add([pid for (pid, _), _ in stored], [t[0] + t[1] for (_, t), _ in stored],
                            [f for _, f in stored])
        prefill_s += time.perf_counter() - start

    outs = iter(search_rows([t for _, t in searched], request.scorer, request.vocab, p,
                            prefill=keep if request.prefill is not None else None) if searched else ())
    for done, row in enumerate(rows):
        if request.progress is not None and done and done % 16 == 0:
            request.progress(done, len(rows), counts)
        for name, _, _ in COLUMNS:
            row[name] = None
        if not searchable(row):
            counts["not_searched"] += 1
            continue
        prompt, canon, _ = triple(row)
        out = next(outs)
        if request.vocab.bytes_of(out.ids) != request.vocab.bytes_of(canon):
            raise AssertionError(f"row {row['prompt_id']}: the search changed the bytes (a bug in search.py)")
        confidence = _stored(out.confidence, CONFIDENCE_DECIMALS)     # decided on as stored
        counts[out.status] += 1
        counts[f"reason_{out.reason}"] += out.reason is not None
        counts["no_bill"] += out.no_bill
        counts[f"capped_{out.status}"] += out.capped
        forwards += out.forwards
        tokens_scored += out.tokens
        candidates += out.candidates
        for phase, figures in out.phases.items():
            acc = phases.setdefault(phase, [0.0, 0.0, 0.0])
            for k, v in enumerate(figures):
                acc[k] += v
        row.update(repair_status=out.status, repair_reason=out.reason, repair_capped=out.capped,
                   repair_no_bill=out.no_bill, repair_target_len=out.target_len,
                   repair_margin_runner_up=_stored(out.margin_runner_up, MARGIN_DECIMALS),
                   repair_margin_canonical=_stored(out.margin_canonical, MARGIN_DECIMALS),
                   repair_confidence=confidence,
                   repair_confidence_hi=_stored(out.confidence_hi, CONFIDENCE_DECIMALS),
                   repair_candidates=out.candidates,
                   repair_forwards=out.forwards, repair_tokens_scored=out.tokens)
        if out.status == "repaired":
            expected += confidence or 0.0
            expected_hi += row["repair_confidence_hi"] or 0.0
            tenths[min(9, int((confidence or 0.0) * 10))] += 1
            if confidence is not None and confidence < p.min_confidence:
                # Kept in the table, repaired ids and all, for the audit; out of training.
                row["quarantine_reason"] = "repair_low_confidence"
                counts["low_confidence"] += 1
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
    prefill = _prefill_figures(request, prefill_s)
    searched = counts["repaired"] + counts["kept"]
    graded = _graded(rows, request.truth) if request.truth is not None else {}
    m = StageMetrics("repair", rows_in=len(rows), rows_out=len(rows), params=as_dict(p),
                     details_only=DETAILS_ONLY)
    m.figures.update({
        "searched": searched,
        "repaired": counts["repaired"], "kept": counts["kept"], "not_searched": counts["not_searched"],
        "kept_by_reason": {k[7:]: v for k, v in sorted(counts.items()) if k.startswith("reason_") and v},
        "no_bill": counts["no_bill"],
        # Rows whose search search_tokens cut (repair_capped): never silent, whatever the outcome.
        "capped": counts["capped_repaired"] + counts["capped_kept"],
        "capped_repaired": counts["capped_repaired"],
        "quarantined_low_confidence": counts["low_confidence"],
        "ambiguous_share": counts["reason_ambiguous"] / searched if searched else 0.0,
        # Without ground truth: how many of the repaired rows the target's own posterior expects
        # to be the ids it sampled (docs/repair.md "Confidence"; bench/repair.py checks it): the
        # low estimate (unscored windows at their bound) and the high one (scored windows only).
        "expected_made_exact": round(expected, 3),
        "expected_made_exact_high": round(expected_hi, 3),
        "expected_exact_share_of_repaired": round(expected / counts["repaired"], 4) if counts["repaired"] else 1.0,
        # Repaired rows per tenth of confidence (low estimate): [0, 0.1) ... [0.9, 1].
        "confidence_tenths": {f"{k / 10:.1f}": n for k, n in enumerate(tenths)},
        "forwards_per_searched_row": forwards / searched if searched else 0.0,
        "tokens_scored_per_searched_row": tokens_scored / searched if searched else 0.0,
        "candidates_per_searched_row": candidates / searched if searched else 0.0,
        # Where the cost goes (docs/repair.md "Cost"): the first pass, window scoring, exact re-scoring.
        "phases": {name: {"forwards": f, "tokens": t, "seconds": round(sec, 3)}
                   for name, (f, t, sec) in sorted(phases.items())},
        **prefill,
        **graded,
    })
    return Result(pa.Table.from_pylist(rows, schema=schema()), m)


def _prefill_figures(request: Request, seconds: float) -> dict:
    """Close the prefill (its manifest last) and say what it holds: the rows the hidden stage
    need not forward again, or why there are none."""
    if request.prefill is None:
        return {"prefill_rows": 0, "prefill_skipped": request.prefill_skipped or "no prefill asked for"}
    manifest = request.prefill.close()
    out = {"prefill_rows": manifest["rows"], "prefill_tokens": manifest["tokens"],
           "prefill_bytes": sum(s["bytes"] for s in manifest["shards"]), "prefill_write_s": round(seconds, 3)}
    if manifest["skipped"]:
        out["prefill_skipped"] = manifest["skipped"]
    return out


def prefill_skipped(params: Any) -> str | None:
    """Why the base pass keeps no features for the hidden stage (None: it keeps them). Two pairs
    share: the in-process target for both stages, or an engine repair starts itself with
    hidden.backend vllm (repair/engine.py)."""
    rp, hp = params.repair, params.hidden
    if hp.mode != "offline":
        return f"hidden.mode {hp.mode}: no features are stored"
    if rp.backend == "hf":
        if hp.backend != "in_process":
            return (f"hidden.backend {hp.backend} with repair.backend hf: the engine's features are not the in-process "
                    "forward's; the engine extracts every row (set repair.backend vllm to share one engine prefill)")
        return None
    if rp.backend == "vllm":
        if rp.base_url:
            return ("repair.base_url names an engine draftgate did not start: its hidden-state files are not ours to "
                    "read; the hidden stage extracts every row (leave repair.base_url null to share one engine prefill)")
        if hp.backend != "vllm":
            return (f"hidden.backend {hp.backend} with repair.backend vllm: the in-process forward does not reuse an "
                    "engine's features; the hidden stage extracts every row")
        return None
    return (f"repair.backend {rp.backend}: its answers carry no hidden states (docs/engines.md); the hidden stage "
            "extracts every row")


def _graded(rows: list[dict], truth: dict[str, list[int]]) -> dict:
    """Against the backend's own ids (the yardstick a text-only API lacks): searched rows that
    differed from them before and after, made exact, broken."""
    before = after = made = broken = capped = capped_made = 0
    for row in rows:
        t = truth.get(row["prompt_id"])
        if row["repair_status"] is None or t is None:
            continue
        was = row["text_ids"] if row["text_ids"] is not None and row["method"] == "repaired" else row["completion_ids"]
        before += was != t
        after += row["completion_ids"] != t
        made += was != t and row["completion_ids"] == t
        broken += was == t and row["completion_ids"] != t
        capped += was != t and row["repair_capped"]
        capped_made += was != t and row["repair_capped"] and row["completion_ids"] == t
    return {"truth": {"differing_before": before, "differing_after": after, "made_exact": made,
                      "exact_broken": broken, "made_exact_share": made / before if before else 1.0,
                      "capped_differing": capped, "capped_made_exact": capped_made}}


@contextlib.contextmanager
def opened(params: Any, tokens: Any, vocab: Any, truth: Any = None, prefill: Any = None) -> Iterator[Request]:
    """The stage's inputs for the length of the block: the tokens table, the contract's vocabulary
    bytes, the scorer of params.repair (backend off: none; vllm without a base_url: an engine
    started here, stopped at the block's end). `truth` (responses.parquet) only grades: the metrics
    count rows equal to the backend's own ids before and after. `prefill` (a directory): the hidden
    stage's features of the rows the search keeps, where prefill_skipped() allows; an empty prefill
    saying why where it does not."""
    import pyarrow.parquet as pq

    from draftgate.prefill import write_skipped

    for path, stage in ((tokens, "reconstruct"), (vocab, "contract")):
        if not path.exists():
            raise RepairError(f"{path}: not found; run the {stage} stage first (dvc repro {stage})")
    table = pq.read_table(tokens)
    sampling = sampling_of(params.repair, params.generate)
    skipped = prefill_skipped(params) if prefill is not None else "no prefill asked for"
    truth_ids = None
    if truth is not None:
        r = pq.read_table(truth, columns=["prompt_id", "truth_ids"]).to_pydict()
        truth_ids = {p: t for p, t in zip(r["prompt_id"], r["truth_ids"]) if t is not None}
    with contextlib.ExitStack() as stack:
        writer = None
        try:
            if params.repair.backend == "vllm" and not params.repair.base_url:
                from draftgate.repair.engine import engine_scorer

                scorer, writer, _ = stack.enter_context(engine_scorer(params, sampling, prefill if skipped is None else None))
            elif skipped is None:
                scorer, writer = _capturing_scorer(params, sampling, prefill)
            else:
                scorer = None if params.repair.backend == "off" else make_scorer(params.repair, sampling, params.hidden)
            if skipped is not None and prefill is not None:
                write_skipped(prefill, skipped)
        except (ValueError, OSError, RuntimeError) as e:   # TargetError, DeviceError, EngineError, a missing base_url: each names its fix
            raise RepairError(str(e)) from None
        yield Request(table, scorer, Vocab.from_table(pq.read_table(vocab)), params.repair, truth_ids,
                      prefill=writer, prefill_skipped=skipped)


def _capturing_scorer(params: Any, sampling: Sampling, directory: Any) -> tuple[Scorer, Any]:
    """The in-process target whose base pass also captures hidden.layers in hidden.dtype, and the
    prefill writer keyed by what those features are (the hidden stage compares its own key)."""
    from draftgate.prefill import PrefillWriter, feature_key
    from draftgate.repair.score import HFScorer
    from draftgate.target import load_target, resolve_layers

    hp = params.hidden
    target = load_target(hp, params.repair.device, "repair.device")
    layers = resolve_layers(hp.layers, target.num_layers)
    scorer = HFScorer(target.model, sampling, params.repair.branch_tokens, capture=(layers, hp.dtype))
    return scorer, PrefillWriter(Path(directory), feature_key(target, layers, hp.dtype))


def sampling_of(params: RepairParams, generate: Any) -> Sampling:
    """The sampler's settings: repair's own where set, else generate's request."""
    t = params.temperature if params.temperature is not None else generate.temperature
    top_p = params.top_p if params.top_p is not None else generate.top_p
    return Sampling(t, top_p, params.top_k)


def make_scorer(params: RepairParams, sampling: Sampling, hidden: Any = None) -> Scorer:
    """The backend of params.backend; `hidden` (HiddenParams) names the in-process target."""
    from draftgate.repair.score import HFScorer, SglangScorer, VllmScorer

    if params.backend == "hf":
        from draftgate.target import load_target

        target = load_target(hidden, params.device, "repair.device")
        return HFScorer(target.model, sampling, params.branch_tokens)
    if not params.base_url:      # vllm without one: repair/engine.py starts the engine (`opened`)
        raise ValueError(f"repair.backend {params.backend} needs repair.base_url (the engine's address)")
    cls = VllmScorer if params.backend == "vllm" else SglangScorer
    return cls(params.base_url, params.model, sampling, params.top_logprobs)
