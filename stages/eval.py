"""DVC stage: held-out prompts -> real speculative decoding with the target, per proposer.

Refuses to run unless the drafter gate passed. For every kept held-out prompt and each proposer
of `eval.proposers` (the n-gram one at vLLM's default setting and each `eval.ngram_sweep`
pair), decodes greedily with draft-and-verify over the target's KV cache and writes:
- data/eval/outputs.parquet: ids per prompt and per-step drafted/accepted/emitted counts, which
  the eval gate holds against its own plain greedy decoding (losslessness);
- metrics/eval.json (the headline numbers) + metrics/eval.details.json (everything: runs, breakdowns,
  settings' text, params);
- plots/eval_per_position.csv: per-position acceptance rate of each reported proposer.
Acceptance length is SGLang's (tokens emitted per verify forward, bonus included): docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stages.eval", description=__doc__)
    p.add_argument("--params", required=True, type=Path)
    p.add_argument("--tokens", required=True, type=Path, help="tokens.parquet (kept held-out rows)")
    p.add_argument("--contract", required=True, type=Path, help="contract.json (the end id, by name)")
    p.add_argument("--drafter", type=Path, help="the exported drafter (data/drafter/sglang); needed for eagle3")
    p.add_argument("--gate", type=Path, help="the drafter gate's metric JSON; needed for eagle3")
    p.add_argument("--speculators", type=Path,
                   help="the speculators export (data/drafter/speculators) vLLM serves; needed for eval.engine vllm")
    p.add_argument("--out", required=True, type=Path, help="output folder (outputs.parquet)")
    p.add_argument("--metrics", required=True, type=Path)
    p.add_argument("--plot", required=True, type=Path, help="per-position acceptance CSV (dvc plots)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.device import torch_threads
    from draftgate.evaluate.measure import evaluate
    from draftgate.evaluate.run import EvalError

    try:
        params = load_params(args.params)
        ep = params.eval
        if "eagle3" in ep.proposers:
            if args.drafter is None or args.gate is None:
                raise EvalError("eval.proposers has eagle3: pass --drafter data/drafter/sglang and "
                                "--gate data/gates/drafter.json")
            from draftgate.gates.result import GateNotPassed, require_passed

            try:
                require_passed(args.gate, "gate_drafter", "fix the drafter (train stage) before evaluating it")
            except GateNotPassed as e:
                raise EvalError(str(e)) from None
        with torch_threads(ep.threads):
            result = evaluate(params, args.tokens, args.contract, args.drafter, args.speculators)
    except (ParamsError, EvalError) as e:
        print(f"eval: {e}", file=sys.stderr)
        return 1
    from draftgate.io import write_json, write_parquet, write_text

    args.out.mkdir(parents=True, exist_ok=True)
    write_parquet(args.out / "outputs.parquet", result.outputs)
    # What the engine was and what its /metrics said before and after (the eval gate parses them
    # itself); {"engine": "replay"} when none ran.
    write_json(args.out / "engine.json", result.engine)
    result.metrics.write(args.metrics)
    write_text(args.plot, _csv(result.metrics.figures))
    return 0


def _csv(report: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    # Over every verify step (per_position_all), the same denominator for each setting: the n-gram
    # proposer's rates over only the steps it drafted on read higher than a drafter's that is better.
    w.writerow(["position", "setting", "acceptance_rate"])
    for setting, s in report["runs"].items():
        for i, rate in s["per_position_all"].items():
            w.writerow([i, setting, "" if rate != rate else round(rate, 6)])
    return buf.getvalue()


if __name__ == "__main__":
    sys.exit(main())
