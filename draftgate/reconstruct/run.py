"""The reconstruct stage's work: responses -> tokens.parquet (streamed), then its metrics and report.

`run(params, ReconstructRequest(...))` checks the contract's ids against the tokenizer
(inputs.py), reconstructs every response into `out`/tokens.parquet a chunk at a time
(table.reconstruct_files: the table is written as it goes, memory does not grow with it), and
reads the written table back, a batch at a time, for the mismatch report and the totals.
stages/reconstruct.py checks the responses gate before it and writes what it returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgate.reconstruct.inputs import InputError


@dataclass(frozen=True)
class ReconstructRequest:
    contract: Path           # contract.json: the special ids, re-checked against the tokenizer
    prompts: Path            # prompts.parquet
    responses: Path          # responses.parquet
    out: Path                # the folder of tokens.parquet


@dataclass
class ReconstructRun:
    metrics: Any             # draftgate.metrics.StageMetrics
    report: dict             # the mismatch report: per dataset and provider, billing
    seconds: float


def run(params: Any, request: ReconstructRequest) -> ReconstructRun:
    """Raises InputError, TemplateError or TokenizerError (each names the file and the fix)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from draftgate.config import as_dict
    from draftgate.metrics import StageMetrics
    from draftgate.official import official_template
    from draftgate.reconstruct.billing_prefill import resolve as resolve_prefill
    from draftgate.reconstruct.core import Setup
    from draftgate.reconstruct.inputs import special_ids
    from draftgate.reconstruct.table import REPORT_COLUMNS, mismatch_report, reconstruct_files
    from draftgate.templates import get_template
    from draftgate.tokenizers import load_tokenizer

    tok = load_tokenizer(params.tokenizer)
    template = get_template(params.template.name)
    ids = special_ids(request.contract, template, tok)
    # A model directory's own template renders the prompts, as the serving engine does.
    official = official_template(tok, "hf_dir", params.tokenizer.path) if params.tokenizer.kind == "hf_dir" else None
    started = time.perf_counter()
    n_responses = _rows(pq, request.responses, "generate")
    _rows(pq, request.prompts, "prompts")
    setup = Setup(tok, template, ids, thinking=params.template.thinking,
                  method=params.reconstruct.method, official=official,
                  request_rules=tuple(params.reconstruct.request_rules),
                  max_repetition=params.reconstruct.max_repetition,
                  prefill=resolve_prefill(tok, ids, params.reconstruct.billing.prefill))
    out = request.out / "tokens.parquet"
    result, billing, _ = reconstruct_files(request.responses, request.prompts, out, setup,
                                           params.reconstruct.on_billing_mismatch,
                                           billing_params=params.reconstruct.billing)
    seconds = time.perf_counter() - started
    # The report and totals from the written table, a batch at a time (memory does not grow with it).
    kept, n_tokens = 0, 0

    def batches():
        nonlocal kept, n_tokens
        for b in pq.ParquetFile(out, pre_buffer=False).iter_batches(batch_size=65_536,
                                                                  columns=REPORT_COLUMNS + ["n_completion"]):
            kept += b.column("quarantine_reason").null_count
            n_tokens += int(pc.sum(b.column("n_completion")).as_py() or 0)
            yield b
    report = mismatch_report(batches(), billing)
    m = StageMetrics("reconstruct", rows_in=n_responses, rows_out=kept)
    for reason, n in result.counts["quarantine"].items():
        m.drop(reason, n)
    m.figures.update({
        "method": dict(result.counts["method"]), "match": dict(result.counts["match"]),
        # Of the mismatched rows: tokens between the common prefix and suffix, text method's
        # side and the reference's (a measure of how much a drafter would learn differently).
        "differing_tokens": {"text": 0, "reference": 0, **result.counts["differing_tokens"]},
        "normalisations": dict(result.counts["normalisations"]),
        "logprobs_fallback": dict(result.counts["logprobs_fallback"]),
        "prompt_render": dict(result.counts["prompt_render"]),
        "quarantine_examples": dict(result.examples), "billing": billing,
        # No timings in the file: an unchanged input gives a byte-identical metric.
        "completion_tokens": n_tokens,
        # seq-rep-4 of every reconstructed completion, in tenths (degenerate.py); rows above
        # reconstruct.max_repetition are quarantined as degenerate.
        "repetition_tenths": dict(sorted(result.counts["repetition"].items())),
        "length_rate_by_dataset": {
            ds: round(result.counts["length_by_dataset"][ds] / n, 6)
            for ds, n in sorted(result.counts["responses_by_dataset"].items())},
    })
    m.params = {"reconstruct": as_dict(params.reconstruct), "template": as_dict(params.template),
                "tokenizer": as_dict(params.tokenizer)}
    print(f"reconstruct: {n_responses} responses -> {kept} kept, "
          f"{n_responses - kept} quarantined; match {dict(result.counts['match'])}; "
          f"{seconds:.1f} s ({n_tokens / max(seconds, 1e-9):,.0f} completion tokens/s)")
    return ReconstructRun(m, report, seconds)


def _rows(pq: Any, path: Path, stage: str) -> int:
    # A named error instead of pyarrow's traceback: which file, and which stage makes it.
    if not path.is_file():
        raise InputError(f"{path}: not found; run the {stage} stage first (dvc repro {stage})")
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception as e:  # pyarrow raises its own types for a corrupt file
        raise InputError(f"{path}: unreadable as Parquet ({type(e).__name__}: {e}); rerun the {stage} stage") from None
