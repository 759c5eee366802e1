"""The prompts stage's work: raw prompt files -> prompts.parquet + rejects.parquet, and the metrics.

`run(params, PromptsRequest(...))` selects the datasets' files, decides every record against the
target (the template as code and the model directory's own template must render it; it must fit
the target's context less generate.max_tokens) and streams them through stream.py;
stages/prompts.py checks the contract gates before it and writes what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PromptsRequest:
    raw: Path                         # the folder of *.jsonl / *.parquet prompt files
    out: Path                         # the folder of prompts.parquet and rejects.parquet


@dataclass(frozen=True)
class PromptsRun:
    metrics: Any                      # draftgate.metrics.StageMetrics
    summary: str                      # one line for the log


def run(params: Any, request: PromptsRequest) -> PromptsRun:
    """Raises ValueError / OSError (naming the file or the param and the fix) on unusable input."""
    from draftgate import prompts
    from draftgate.prompts.stream import ingest_to_files

    pp = params.prompts
    files = _selected(prompts.raw_files(request.raw), pp.datasets, request.raw)
    records = (r for path in files for r in _read(prompts, path))
    # Streamed (stream.py): files in name order, records in line order, two passes
    # over part files; memory does not grow with the rows.
    problem, limit = _render_problem(params)
    tally = ingest_to_files(records, pp, request.out, problem, params.template.thinking)
    metrics = prompts.stage_metrics(tally, pp, limit)
    metrics.figures["contamination"] = _contamination(request.out / "prompts.parquet", pp.near_duplicate_threshold)
    summary = (f"prompts: {metrics.rows_in} records -> {metrics.rows_out} prompts "
               f"({metrics.figures['n_rejects']} rejected, {tally.n_duplicates} duplicates, "
               f"{metrics.figures['split']['heldout']} heldout)")
    return PromptsRun(metrics, summary)


def _contamination(path: Path, threshold: float) -> dict:
    """Heldout prompts that duplicate train prompts, read back from the written table a batch at a time."""
    import pyarrow.parquet as pq

    from draftgate.prompts.contamination import contamination

    rows = (r for b in pq.ParquetFile(path).iter_batches(batch_size=8192, columns=["prompt_id", "split", "messages"])
            for r in b.to_pylist())
    return contamination(rows, threshold).to_dict(threshold)


def _selected(files: list[Path], datasets: list[str] | None, raw: Path) -> list[Path]:
    if datasets is None:
        return files
    by_stem = {f.stem: f for f in files}
    missing = [d for d in datasets if d not in by_stem]
    if missing:
        raise ValueError(f"prompts.datasets names {missing}, which {raw} does not hold; "
                         f"available: {sorted(by_stem)}")
    return [f for f in files if f.stem in datasets]


def _render_problem(params):
    """The target's verdict on each prompt: None when it renders, else why not. The template as
    code must render it, and so must the model directory's own template where there is one (the
    serving engine renders with that one: a prompt it refuses would be paid for and fail); its
    tokens must leave generate.max_tokens of the target's context (too_long). Also returns the
    length limit, for the metrics."""
    from draftgate.official import OfficialTemplateError, official_template
    from draftgate.prompts import length_limit, too_long, widest_token
    from draftgate.provider_rules import apply_rules
    from draftgate.templates import TemplateError, encode_segments, get_template
    from draftgate.tokenizers import load_tokenizer

    template = get_template(params.template.name)
    tok = load_tokenizer(params.tokenizer)
    official = None
    if params.tokenizer.kind == "hf_dir":
        official = official_template(tok, "hf_dir", params.tokenizer.path)
    limit = length_limit(params.prompts.context_tokens, tok.hf.model_max_length, params.generate.max_tokens,
                         params.tokenizer.path if params.tokenizer.kind == "hf_dir" else None)
    ids = {n: tok.token_id(n) for n in template.special_names}     # by name; the contract proves them
    length = too_long(limit, lambda segs: encode_segments(tok, [segs], ids)[0], template.name,
                      params.generate.max_tokens, widest_token(tok) if limit.max_prompt_tokens else None)

    def problem(messages, tools, thinking):
        # Rendered in the prompt's own serving mode (prompts.thinking, a record's "thinking").
        tools = apply_rules(tools, params.reconstruct.request_rules)
        try:
            segments = template.render_prompt(messages, tools, thinking)
        except TemplateError as e:
            return f"the {template.name} template cannot render this prompt with thinking " \
                   f"{'on' if thinking else 'off'}: {e}; choose a template that supports it (template.name), " \
                   "set the dataset's mode (prompts.thinking) or leave its dataset out (prompts.datasets)"
        if official is not None:
            try:
                official.render(messages, tools, template.jinja_kwargs(thinking))
            except OfficialTemplateError as e:
                return f"{e}; leave such prompts out (prompts.datasets) or fix the model directory"
        return length(segments)

    return problem, limit


def _read(prompts, path: Path):
    try:
        yield from prompts.read_raw(path)
    except Exception as e:  # pyarrow raises its own types (ArrowInvalid, ...) for a corrupt Parquet file
        raise OSError(f"{path}: cannot be read ({type(e).__name__}: {e}); fix or remove the file") from None
