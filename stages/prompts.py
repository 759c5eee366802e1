"""DVC stage `prompts`: raw prompt files -> prompts.parquet + rejects.parquet + metrics.

python -m stages.prompts --params params.yaml --raw data/raw --out data/prompts --metrics metrics/prompts.json \
    --gate data/gates/contract.json --gate data/gates/template.json

Exit 0 even with rejects (the prompts gate decides); exit 2 when the input cannot be used at all,
or a contract gate did not pass.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stages.prompts", description=__doc__.splitlines()[0])
    p.add_argument("--params", required=True, help="params.yaml (reads the prompts section)")
    p.add_argument("--raw", required=True, help="directory of *.jsonl / *.parquet prompt files")
    p.add_argument("--out", required=True, help="output directory for prompts.parquet and rejects.parquet")
    p.add_argument("--metrics", required=True, help="metrics JSON to write")
    p.add_argument("--gate", action="append", default=[], type=Path, metavar="METRIC",
                   help="an upstream gate's metric (data/gates/contract.json, data/gates/template.json); "
                        "refuses to run unless each records success (repeatable)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate import prompts
    from draftgate.config import ParamsError, load_params
    from draftgate.gates.result import GateNotPassed, require_passed
    from draftgate.prompts_stream import ingest_to_files

    try:
        all_params = load_params(args.params)
        for gate in args.gate:   # the tokenizer and template contracts: nothing is rendered before them
            require_passed(gate, f"gate_{gate.stem}", "fix the contract (tokenizer, template params) first")
        params = all_params.prompts
        files = _selected(prompts.raw_files(args.raw), params.datasets, args.raw)
        records = (r for path in files for r in _read(prompts, path))
        # Streamed (prompts_stream.py): files in name order, records in line order, two passes
        # over part files; memory does not grow with the rows.
        problem, limit = _render_problem(all_params)
        tally = ingest_to_files(records, params, Path(args.out), problem)
    except (ParamsError, GateNotPassed, OSError, ValueError) as e:
        print(f"stages.prompts: {e}", file=sys.stderr)
        return 2
    metrics = prompts.stage_metrics(tally, params, limit)
    metrics.write(args.metrics)
    print(f"prompts: {metrics.rows_in} records -> {metrics.rows_out} prompts "
          f"({metrics.figures['n_rejects']} rejected, {tally.n_duplicates} duplicates, "
          f"{metrics.figures['split']['heldout']} heldout)")
    return 0


def _selected(files: list[Path], datasets: list[str] | None, raw: str) -> list[Path]:
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
    from draftgate.reconstruct.request import apply_rules
    from draftgate.templates import TemplateError, encode_segments, get_template
    from draftgate.tokenizers import load_tokenizer

    template, thinking = get_template(params.template.name), params.template.thinking
    tok = load_tokenizer(params.tokenizer)
    official = None
    if params.tokenizer.kind == "hf_dir":
        official = official_template(tok, "hf_dir", params.tokenizer.path)
    limit = length_limit(params.prompts.context_tokens, tok.hf.model_max_length, params.generate.max_tokens,
                         params.tokenizer.path if params.tokenizer.kind == "hf_dir" else None)
    ids = {n: tok.token_id(n) for n in template.special_names}     # by name; the contract proves them
    length = too_long(limit, lambda segs: encode_segments(tok, [segs], ids)[0], template.name,
                      params.generate.max_tokens, widest_token(tok) if limit.max_prompt_tokens else None)

    def problem(messages, tools):
        tools = apply_rules(tools, params.reconstruct.request_rules)
        try:
            segments = template.render_prompt(messages, tools, thinking)
        except TemplateError as e:
            return f"the {template.name} template cannot render this prompt: {e}; choose a template " \
                   f"that supports it (template.name) or leave its dataset out (prompts.datasets)"
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


if __name__ == "__main__":
    sys.exit(main())
