"""The eval stage's work: held-out prompts decoded by every proposer with the target -> outputs, report.

`evaluate()` returns an EvalRun: the outputs table (ids and per-step counts, which the eval gate
holds against its own greedy decoding), the engine's record and the stage's StageMetrics (acceptance
length per setting with bootstrap intervals, per-position rates, SpecForge's proxy), as every
stage library returns its metrics; stages/eval.py checks the drafter gate and writes them.
Kept apart from run.py, which the eval gate's check imports, so a change here does not rerun it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The metric DVC shows is each proposer's acceptance length with its interval (12 columns, 260
# characters a line). The breakdowns (draftgate/metrics.py BREAKDOWNS: the per-setting runs, per
# dataset, mode and position) and these keys are in the details only: the settings and counts, the
# gap between served modes (from the per-mode breakdown), vLLM's definition of the length and
# SpecForge's proxy.
DETAILS_ONLY = ("k", "max_new_tokens", "prompts", "tokens", "verify_forwards", "accepted_fraction",
                "vllm_acceptance_length", "mode_gap", "proxy", "proxy_simulated_acceptance_length")


@dataclass
class EvalRun:
    outputs: Any                 # pyarrow Table: outputs.parquet
    engine: dict[str, Any]       # engine.json: what the engine was and its /metrics ({"engine": "replay"} when none ran)
    metrics: Any                 # draftgate.metrics.StageMetrics: rows in = held-out prompts, out = decoded rows


def evaluate(params: Any, tokens: Path, contract: Path, drafter_dir: Path | None,
             speculators_dir: Path | None = None) -> EvalRun:
    """Every proposer of `eval.proposers` decoding the kept held-out prompts of `tokens` with the
    target: the outputs table and the metrics (figures per setting, the drafter's and the n-gram
    baseline's, SpecForge's proxy). With `eval.engine: vllm`, vLLM also decodes them with the
    speculators export (`speculators_dir`; evaluate/engine.py): its outputs join the table
    (proposer "vllm", no per-step counts: the engine reports counters), its counters the metrics
    (`engine`), and its record is EvalRun.engine."""
    from draftgate.evaluate import ngram, stats
    from draftgate.evaluate.proposers import (
        Eagle3Proposer, NgramProposer, OracleProposer, RandomProposer)
    from draftgate.evaluate.run import (
        EvalError, Run, by_group, decode_all, end_ids_from_contract, heldout_rows, load_eagle3, mode_gap,
        outputs_table, simulated_acceptance, summarise)
    from draftgate.target import load_target

    ep = params.eval
    prompts = heldout_rows(tokens, ep.max_prompts)
    end_ids = end_ids_from_contract(contract)
    started = time.perf_counter()
    target = load_target(params.hidden, ep.device, "eval.device")
    model, dev = target.model, target.device
    print(f"eval: {len(prompts)} held-out prompts, k={ep.k}, max_new_tokens={ep.max_new_tokens}, "
          f"device {dev}, target loaded in {time.perf_counter() - started:.1f} s")

    runs: list[Run] = []
    replayed: dict[str, float] = {}     # n-gram sweep: acceptance length replayed over verified ids
    drafter = None

    def timed(proposer_name: str, setting: str, numbers: dict, make, aux_layers=None) -> Run:
        t0 = time.perf_counter()
        outs = decode_all(model, dev, prompts, make, ep.k, ep.max_new_tokens, end_ids, aux_layers, ep.batch_size)
        run = Run(proposer_name, setting, outs, numbers)
        tokens = sum(len(d.ids) for d in outs)
        steps = sum(len(d.emitted) for d in outs)
        print(f"  {setting:<16} {tokens} tokens in {steps} verify forwards "
              f"({(tokens - len(outs)) / max(steps, 1):.2f} per forward), {time.perf_counter() - t0:.1f} s")
        runs.append(run)
        return run

    k = {"k": ep.k}
    for name in ep.proposers:
        if name == "eagle3":
            drafter = load_eagle3(drafter_dir, target)
            timed("eagle3", "eagle3", k, lambda: Eagle3Proposer(drafter), drafter.config.aux_layers)
        elif name == "ngram":
            # vLLM's default setting decoded for real; the sweep replayed over its verified ids (exact:
            # the output is the target's greedy ids whatever the proposer, ngram.replay); the best
            # setting, when not the default, decoded for real too, so both reported figures are measured.
            lo, hi = ep.ngram_min, ep.ngram_max
            default = timed("ngram", f"ngram_{lo}_{hi}", {**k, "n_min": lo, "n_max": hi}, lambda: NgramProposer(lo, hi))
            for a, b in dict.fromkeys(tuple(p) for p in [(lo, hi)] + ep.ngram_sweep):
                replayed[f"ngram_{a}_{b}"] = stats.acceptance_length([
                    stats.PromptSteps(*ngram.replay(pr.prompt, d.ids, ep.k, a, b))
                    for pr, d in zip(prompts, default.outputs)])
            best = max(replayed, key=lambda s: (replayed[s], s == default.setting))
            if best != default.setting:
                a, b = (int(x) for x in best.split("_")[1:])
                timed("ngram", best, {**k, "n_min": a, "n_max": b}, lambda: NgramProposer(a, b))
        elif name == "oracle":
            timed("oracle", "oracle", k, lambda: OracleProposer(model, dev))
        elif name == "random":
            timed("random", "random", k, lambda: RandomProposer(target.vocab_size, ep.seed))

    summaries = {r.setting: summarise(r, ep.k, ep.bootstrap_samples, ep.seed) for r in runs}
    # Per dataset and per serving mode (the tokens table's labels; the eval gate recomputes the
    # mode from the prompt ids), and the gap between the best and worst served mode.
    served = [m.name for m in params.serving.modes]
    for r in runs:
        s = summaries[r.setting]
        s["by_dataset"] = by_group(r, prompts, lambda p: p.dataset or "unknown", ep.bootstrap_samples, ep.seed)
        s["by_mode"] = by_group(r, prompts, lambda p: p.mode or "unknown", ep.bootstrap_samples, ep.seed)
        s["mode_gap"] = mode_gap(s["by_mode"], served)
    rows_out = len(prompts) * len(runs)
    report: dict = {"k": ep.k, "max_new_tokens": ep.max_new_tokens,
                    "definition": "acceptance_length = tokens emitted per target verify forward, bonus token "
                                  "included (SGLang; vLLM's 1 + accepted/drafts is vllm_acceptance_length); "
                                  "ci95 = bootstrap percentile interval over prompts",
                    "runs": summaries}
    if drafter is not None:
        report["drafter"] = summaries["eagle3"]
        sim = simulated_acceptance(drafter, target, prompts, ep.k)
        report["drafter"]["proxy_simulated_acceptance_length"] = sim["simulated_acceptance_length"]
        report["drafter"]["proxy_step_accuracy"] = {str(i): a for i, a in enumerate(sim["step_accuracy"], 1)}
        report["proxy"] = {"what": "SpecForge's teacher-forced simulated acceptance length sum_k prod_{i<=k} acc_i "
                                   "on the held-out rows' reference completions (no bonus token): a proxy, not "
                                   "measured decoding", **sim,
                           "step_accuracy": {str(i): a for i, a in enumerate(sim["step_accuracy"], 1)}}
    measured = {s: v for s, v in summaries.items() if s.startswith("ngram_")}
    if measured:
        default = f"ngram_{ep.ngram_min}_{ep.ngram_max}"
        best = max(replayed, key=lambda s: (replayed[s], s == default))
        report["ngram"] = {**measured[default], "setting": default,
                           "best": {**measured[best], "setting": best},
                           "sweep_replayed": replayed}
    for name in ("oracle", "random"):
        if name in summaries:
            report[name] = summaries[name]
    table_runs = list(runs)
    if ep.engine == "vllm":
        from draftgate.evaluate import engine
        from draftgate.evaluate.loop import Decoded

        if speculators_dir is None or "eagle3" not in summaries:
            raise EvalError("eval.engine vllm serves the speculators export with the eagle3 replay beside it: "
                            "pass --speculators data/drafter/speculators and keep eagle3 in eval.proposers")
        t0 = time.perf_counter()
        replay = next(r for r in runs if r.setting == "eagle3").outputs
        served, report["engine"], engine_record = engine.measure(params, prompts, speculators_dir, end_ids, replay)
        report["engine"]["seconds"] = round(time.perf_counter() - t0, 1)
        table_runs.append(Run("vllm", engine.SETTING, [Decoded(ids, finish, None, None, None)
                                                       for ids, finish in zip(served.ids, served.finish)], k))
        rows_out += len(prompts)
        e = report["engine"]
        print(f"  vllm engine: acceptance length {e['acceptance_length']:.4f} (vLLM's), replay "
              f"{e['replay_acceptance_length']:.4f}; {e['drafts']} drafts (replay {e['replay_drafts']}), outputs "
              f"equal to the replay's {e['outputs_equal_replay']}/{e['outputs']}, {e['seconds']} s")
    else:
        engine_record = {"engine": "replay"}
    print(f"eval: done in {time.perf_counter() - started:.1f} s")
    for name in ("drafter", "ngram"):
        if name in report:
            r = report[name]
            print(f"  {name}: acceptance length {r['acceptance_length']:.3f} "
                  f"(95% CI {r['ci95']['low']:.3f}-{r['ci95']['high']:.3f})")
            for group in ("by_dataset", "by_mode"):
                for g, v in r[group].items():
                    print(f"    {g:<14} {v['acceptance_length']:.3f} (95% CI {v['ci95']['low']:.3f}-"
                          f"{v['ci95']['high']:.3f}, {v['prompts']} prompts)")
    from draftgate.config import as_dict
    from draftgate.metrics import StageMetrics

    m = StageMetrics("eval", rows_in=len(prompts), rows_out=rows_out, details_only=DETAILS_ONLY)
    m.figures.update(report)
    m.params = {"eval": as_dict(ep)}
    return EvalRun(outputs_table(prompts, table_runs), engine_record, m)
