"""`draftgate estimate`: projected tokens, cost and wall time of the generate stage; sends nothing.

Prompt tokens are counted with the configured tokenizer (message texts + tools JSON, plus a few
tokens per message for the chat template) when it loads, else approximated as characters / 4 and
labelled so. Completion tokens: `max_tokens` per prompt as the upper bound, and `--fill` of it as a
typical run. Wall time: waves of `concurrency` requests, each taking `--ttft-s` plus the typical
completion at `--decode-tok-s` per request. `--prompts N` plans a run of N prompts: the prompt
tokens per prompt are measured on the table (a sample of what you will send) and scaled to N.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from typing import Any

from draftgate.client.request import Prompt

TEMPLATE_TOKENS_PER_MESSAGE = 5   # ChatML: <|im_start|>, role, \n ... <|im_end|>, \n


@dataclass(frozen=True)
class Estimate:
    prompts: int
    prompt_tokens: int
    prompt_tokens_method: str          # "tokenizer:<name>" or "chars/4 (no tokenizer: <why>)"
    completion_tokens_max: int
    completion_tokens_typical: int
    fill: float
    cost_usd_max: float
    cost_usd_typical: float
    budget_usd: float
    concurrency: int
    wall_s_typical: float
    wall_s_max: float
    ttft_s: float = 1.0                # the wall-time assumptions, printed beside the figure
    decode_tok_s: float = 50.0


def prompt_text(p: Prompt) -> str:
    parts = [m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
             for m in p.messages]
    for m in p.messages:
        if m.get("tool_calls"):
            parts.append(json.dumps(m["tool_calls"]))
    if p.tools:
        parts.append(json.dumps(p.tools))
    return "\n".join(parts)


def count_prompt_tokens(prompts: list[Prompt], tokenizer: Any | None, why_not: str = "") -> tuple[int, str]:
    overhead = sum(TEMPLATE_TOKENS_PER_MESSAGE * len(p.messages) for p in prompts)
    if tokenizer is not None:
        ids = tokenizer.encode_ordinary_batch([prompt_text(p) for p in prompts])
        return sum(map(len, ids)) + overhead, f"tokenizer:{getattr(tokenizer, 'name', type(tokenizer).__name__)}"
    chars = sum(len(prompt_text(p)) for p in prompts)
    return math.ceil(chars / 4) + overhead, f"chars/4 (no tokenizer: {why_not})"


def estimate(prompts: list[Prompt], gp: Any, tokenizer: Any | None, why_not: str = "",
             fill: float = 0.5, ttft_s: float = 1.0, decode_tok_s: float = 50.0,
             n: int | None = None) -> Estimate:
    """`n`: plan for n prompts, the prompt tokens scaled from `prompts` (a sample); None: `prompts` itself."""
    from draftgate.client.budget import price_of

    prompt_tokens, method = count_prompt_tokens(prompts, tokenizer, why_not)
    if n is not None:
        if not prompts:
            raise ValueError("the prompts table holds no prompts to measure a plan on")
        prompt_tokens, method = round(prompt_tokens * n / len(prompts)), f"{method}, scaled from {len(prompts):,} prompts"
    else:
        n = len(prompts)
    max_c = n * gp.max_tokens
    typ_c = round(max_c * fill)
    waves = math.ceil(n / max(gp.concurrency, 1))
    return Estimate(
        prompts=n, prompt_tokens=prompt_tokens, prompt_tokens_method=method,
        completion_tokens_max=max_c, completion_tokens_typical=typ_c, fill=fill,
        cost_usd_max=round(price_of(gp.price, prompt_tokens, max_c), 4),
        cost_usd_typical=round(price_of(gp.price, prompt_tokens, typ_c), 4),
        budget_usd=gp.budget_usd, concurrency=gp.concurrency,
        wall_s_typical=round(waves * (ttft_s + gp.max_tokens * fill / decode_tok_s), 1),
        wall_s_max=round(waves * (ttft_s + gp.max_tokens / decode_tok_s), 1),
        ttft_s=ttft_s, decode_tok_s=decode_tok_s,
    )


def render(e: Estimate) -> str:
    rows = [
        ("prompts", f"{e.prompts:,}"),
        ("prompt tokens", f"{e.prompt_tokens:,}  [{e.prompt_tokens_method}]"),
        ("completion tokens", f"{e.completion_tokens_typical:,} typical ({e.fill:.0%} fill) / "
                              f"{e.completion_tokens_max:,} max"),
        ("cost", f"${e.cost_usd_typical:,.2f} typical / ${e.cost_usd_max:,.2f} max"
                 + (f"  (budget ${e.budget_usd:,.2f} for the whole journal, every run)" if e.budget_usd
                    else "  (no budget set)")),
        ("wall time", f"{e.wall_s_typical / 60:,.1f} min typical / {e.wall_s_max / 60:,.1f} min max "
                      f"at {e.concurrency:,} in flight, assuming {e.ttft_s:g} s to first token and "
                      f"{e.decode_tok_s:g} tok/s per request (--ttft-s, --decode-tok-s; a local CPU "
                      f"model shares its throughput across requests: measure it with bench/serve.py)"),
    ]
    text = "\n".join(f"{k:<18} {v}" for k, v in rows)
    if e.budget_usd and e.cost_usd_max > e.budget_usd:
        text += ("\nnote: the worst case exceeds the budget; the run will stop when the budget cannot "
                 "cover the next request (raise generate.budget_usd or lower max_tokens)")
    return text


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: --prompts takes a count of prompts, e.g. --prompts 100000 "
                                         "(the prompts table is --table PATH)")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="draftgate estimate", description=__doc__.splitlines()[0])
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--table", default="data/prompts/prompts.parquet",
                   help="the prompts stage's table, read for the prompts' lengths (default %(default)s)")
    p.add_argument("--prompts", type=_count, metavar="N",
                   help="plan a run of N prompts, scaled from the table's (default: the table's, after generate.limit)")
    p.add_argument("--fill", type=float, default=0.5, help="typical fraction of max_tokens used (default 0.5)")
    p.add_argument("--ttft-s", type=float, default=1.0, help="assumed time to first token per request")
    p.add_argument("--decode-tok-s", type=float, default=50.0, help="assumed decode speed per request")
    p.add_argument("--no-tokenizer", action="store_true", help="skip loading the tokenizer; use chars/4")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = p.parse_args(argv)
    from draftgate.client import read_prompts, select
    from draftgate.config import ParamsError, load_params

    try:
        params = load_params(a.params)
        prompts = read_prompts(a.table)
        prompts = prompts if a.prompts is not None else select(prompts, params.generate.limit)
    except (ParamsError, OSError, ValueError) as e:
        print(f"draftgate estimate: {e}", file=sys.stderr)
        return 2
    tokenizer, why_not = None, "--no-tokenizer"
    if not a.no_tokenizer:
        try:
            from draftgate.tokenizers import load_tokenizer
            tokenizer = load_tokenizer(params.tokenizer)
        except Exception as e:  # any loader failure falls back to chars/4, and the output says why
            why_not = f"{type(e).__name__}: {str(e)[:120]}"
    try:
        e = estimate(prompts, params.generate, tokenizer, why_not, a.fill, a.ttft_s, a.decode_tok_s, a.prompts)
    except ValueError as err:
        print(f"draftgate estimate: {a.table}: {err}; run the prompts stage on a sample first", file=sys.stderr)
        return 2
    print(json.dumps(asdict(e), indent=2) if a.json else render(e))
    from draftgate.client.budget import budget_problem

    problem = budget_problem(params.generate)
    if problem:
        print(f"draftgate estimate: the generate stage will refuse these params: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
