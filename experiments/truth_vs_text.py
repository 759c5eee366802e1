"""Truth vs text vs repaired: does training on text-reconstructed ids cost the drafter acceptance
length, and does repair (docs/repair.md) win it back?

    .venv/bin/python experiments/truth_vs_text.py                       # the README's nine runs
    .venv/bin/python experiments/truth_vs_text.py --truth A B C --text D E F --repaired G H I --samples 4000
    .venv/bin/python experiments/truth_vs_text.py --repaired             # two arms: truth and text

Reads each experiment's tokens and eval outputs from DVC's cache (dvc.api, by experiment name)
and prints:
- the data: rows and tokens of the training split whose ids differ between the arms (tokens
  between the common prefix and suffix of each differing row, reconstruct/classify.py);
- per run, the EAGLE-3 drafter's acceptance length (tokens per target forward, bonus included,
  as SGLang counts it) with its 95% bootstrap interval over the held-out prompts, by the eval
  stage's own functions (draftgate/evaluate/stats.py);
- per arm, the mean over seeds and the seed-to-seed standard deviation;
- the difference of each arm from truth (text - truth, repaired - truth) with a 95% interval
  from stats.arms_difference: a bootstrap that
  resamples the prompts (the same held-out prompts in every run, so paired) and the seeds of each
  arm together, so the interval holds both the prompt noise and the seed noise.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def table(path: str, rev: str):
    import dvc.api
    import pyarrow.parquet as pq

    with dvc.api.open(path, repo=str(REPO), rev=rev, mode="rb") as f:
        return pq.read_table(io.BytesIO(f.read()))


def eval_runs(rev: str) -> dict[str, object]:
    """prompt id -> the EAGLE-3 drafter's verify steps on it (evaluate.stats.PromptSteps)."""
    from draftgate.evaluate.stats import PromptSteps

    rows = table("data/eval/outputs.parquet", rev).to_pylist()
    return {r["prompt_id"]: PromptSteps(r["drafted"], r["accepted"], r["emitted"])
            for r in rows if r["proposer"] == "eagle3"}


def tokens_table(rev: str):
    """The table hidden and train read: repair's output where the run has one (since the repair
    stage), else the reconstruct stage's (runs made before it)."""
    try:
        return table("data/repair/tokens.parquet", rev)
    except Exception:        # dvc.api: PathMissingError / FileNotFoundError, by DVC version
        return table("data/tokens/tokens.parquet", rev)


def data_difference(truth: str, text: str) -> dict[str, int]:
    from draftgate.reconstruct.classify import differing_span, first_difference

    a = {r["prompt_id"]: r for r in tokens_table(truth).to_pylist()}
    b = {r["prompt_id"]: r for r in tokens_table(text).to_pylist()}
    out = {"train_rows": 0, "train_tokens": 0, "rows_differing": 0, "text_tokens": 0, "truth_tokens": 0}
    for pid, r in a.items():
        if r["split"] != "train" or r["completion_ids"] is None or pid not in b:
            continue
        x, y = list(b[pid]["completion_ids"]), list(r["completion_ids"])
        out["train_rows"] += 1
        out["train_tokens"] += len(y)
        if x != y:
            span = differing_span(x, y, first_difference(x, y))
            out["rows_differing"] += 1
            out["text_tokens"] += span[0]
            out["truth_tokens"] += span[1]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--truth", nargs="+", default=["truth-seed0", "truth-seed1", "truth-seed2"])
    p.add_argument("--text", nargs="+", default=["text-seed0", "text-seed1", "text-seed2"])
    p.add_argument("--repaired", nargs="*", default=["repaired-seed0", "repaired-seed1", "repaired-seed2"],
                   help="text + repair runs (none: compare truth and text only)")
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    arms = {"truth": a.truth, "text": a.text, **({"repaired": a.repaired} if a.repaired else {})}
    for arm, names in list(arms.items())[1:]:
        d = data_difference(a.truth[0], names[0])
        print(f"training split, {arm}: {d['rows_differing']} of {d['train_rows']} rows differ from truth; "
              f"{d['text_tokens']} {arm} tokens stand for {d['truth_tokens']} true ones "
              f"({d['truth_tokens'] / d['train_tokens']:.2%} of {d['train_tokens']} completion tokens)")

    from draftgate.evaluate import stats

    runs = {name: eval_runs(name) for names in arms.values() for name in names}
    prompts = sorted(set.intersection(*(set(r) for r in runs.values())))
    steps = {name: [r[p] for p in prompts] for name, r in runs.items()}
    print(f"\n{'run':<14}{'acceptance':>11}  95% interval over {len(prompts)} prompts")
    for name, run in steps.items():
        lo, hi = stats.bootstrap_ci(run, a.samples, a.seed)
        print(f"{name:<14}{stats.acceptance_length(run):>11.3f}  [{lo:.3f}, {hi:.3f}]")

    print(f"\n{'arm':<10}{'mean':>8}{'seed sd':>9}  runs")
    for arm, names in arms.items():
        values = [stats.acceptance_length(steps[n]) for n in names]
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        print(f"{arm:<10}{statistics.mean(values):>8.3f}{sd:>9.3f}  {', '.join(f'{v:.3f}' for v in values)}")

    print()
    for arm, names in list(arms.items())[1:]:
        diff, lo, hi = stats.arms_difference([steps[n] for n in a.truth], [steps[n] for n in names],
                                             a.samples, a.seed)
        verdict = "distinguishable from" if lo > 0 or hi < 0 else "within"
        print(f"{arm} - truth: {diff:+.3f} [{lo:+.3f}, {hi:+.3f}] (prompts and seeds resampled): {verdict} the noise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
