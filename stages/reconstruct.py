"""DVC stage: API responses -> exact token ids (data/tokens/tokens.parquet), mismatch report.

Quarantined rows stay in tokens.parquet with `quarantine_reason` set (kept rows: null), so one
table holds every response and its fate; consumers select `quarantine_reason IS NULL`.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.reconstruct", description=__doc__)
    p.add_argument("--params", required=True, type=Path)
    p.add_argument("--contract", required=True, type=Path, help="contract.json (special ids)")
    p.add_argument("--prompts", required=True, type=Path, help="prompts.parquet")
    p.add_argument("--responses", required=True, type=Path, help="responses.parquet")
    p.add_argument("--gate", required=True, type=Path, help="the responses gate's result JSON")
    p.add_argument("--out", required=True, type=Path, help="output directory (tokens.parquet)")
    p.add_argument("--metrics", required=True, type=Path)
    p.add_argument("--report", required=True, type=Path,
                   help="mismatch report JSON (a DVC metric, numbers only; all of it in <report>.details.json)")
    p.add_argument("--plot", required=True, type=Path, help="per-dataset mismatch CSV (dvc plots)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from draftgate.config import ParamsError, as_dict, load_params
    from draftgate.io import write_json, write_text
    from draftgate.metrics import StageMetrics, details_path, numbers
    from draftgate.official import official_template
    from draftgate.gates.result import GateNotPassed, require_passed
    from draftgate.reconstruct.inputs import InputError, special_ids
    from draftgate.reconstruct.core import Setup
    from draftgate.reconstruct.table import REPORT_COLUMNS, mismatch_report, plot_rows, reconstruct_files
    from draftgate.templates import TemplateError, get_template
    from draftgate.tokenizers import TokenizerError, load_tokenizer

    try:
        params = load_params(args.params)
        require_passed(args.gate, "gate_responses", "fix the responses before reconstructing them")
        tok = load_tokenizer(params.tokenizer)
        template = get_template(params.template.name)
        ids = special_ids(args.contract, template, tok)
        # A model directory's own template renders the prompts, as the serving engine does.
        official = official_template(tok, "hf_dir", params.tokenizer.path) \
            if params.tokenizer.kind == "hf_dir" else None
        started = time.perf_counter()
        n_responses = _rows(pq, args.responses, "generate")
        _rows(pq, args.prompts, "prompts")
    except (ParamsError, GateNotPassed, InputError, TemplateError, TokenizerError) as e:
        print(f"reconstruct: {e}", file=sys.stderr)
        return 1
    setup = Setup(tok, template, ids, thinking=params.template.thinking,
                  method=params.reconstruct.method, official=official,
                  request_rules=tuple(params.reconstruct.request_rules))
    # Streamed: responses in chunks, tokens.parquet written as it goes (bounded memory).
    out = args.out / "tokens.parquet"
    result, billing, _ = reconstruct_files(args.responses, args.prompts, out, setup,
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
    })
    m.params = {"reconstruct": as_dict(params.reconstruct), "template": as_dict(params.template),
                "tokenizer": as_dict(params.tokenizer)}
    m.write(args.metrics)
    # Numbers only in the metric (dvc metrics show); the whole report, text and nulls too, beside it.
    write_json(details_path(args.report), report)
    write_json(args.report, numbers(report))
    write_text(args.plot, _csv(plot_rows(report)))
    print(f"reconstruct: {n_responses} responses -> {kept} kept, "
          f"{n_responses - kept} quarantined; match {dict(result.counts['match'])}; "
          f"{seconds:.1f} s ({n_tokens / max(seconds, 1e-9):,.0f} completion tokens/s)")
    return 0


def _rows(pq, path: Path, stage: str) -> int:
    from draftgate.reconstruct.inputs import InputError

    # A named error instead of pyarrow's traceback: which file, and which stage makes it.
    if not path.is_file():
        raise InputError(f"{path}: not found; run the {stage} stage first (dvc repro {stage})")
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception as e:  # pyarrow raises its own types for a corrupt file
        raise InputError(f"{path}: unreadable as Parquet ({type(e).__name__}: {e}); rerun the {stage} stage") from None


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    fields = list(rows[0]) if rows else ["dataset"]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


if __name__ == "__main__":
    sys.exit(main())
