"""The eval stage end to end on real SmolLM2, and the eval gate's second opinion on its outputs.

The stage decodes two held-out prompts with an exported (untrained) EAGLE-3 drafter, the n-gram
proposer and the oracle; the gate recomputes plain greedy decoding itself and must pass the
artifact as written, and fail it when one token of one output is changed, when a training prompt
appears, or when the acceptance-length floor is above what the drafter reached.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eval_fixtures import PROMPTS, contract, random_drafter, tokens_table

EVAL = {"proposers": ["eagle3", "ngram", "oracle"], "k": 3, "max_new_tokens": 12,
        "ngram_min": 5, "ngram_max": 5, "ngram_sweep": [[1, 2]], "bootstrap_samples": 200, "device": "cpu",
        "threads": 1}    # 1: the suite's (conftest.py)


def write_params(path: Path, floor: float = 1.0, mode_floor: float | None = 1.0, served=None) -> Path:
    # mode_floor 1.0: every served mode must be measured (the pass below holds it too).
    path.write_text(yaml.safe_dump({"hidden": {"device": "cpu"}, "eval": EVAL,
                                    "gates": {"eval": {"min_acceptance_length": floor,
                                                       "min_mode_acceptance_length": mode_floor}},
                                    **({"serving": {"modes": served}} if served else {})}))
    return path


@pytest.fixture(scope="module")
def staged(tmp_path_factory, smollm2_tok):
    from draftgate.config import HiddenParams
    from draftgate.drafter.export import export_sglang
    from draftgate.target import load_target
    from draftgate.serve.model import resolve_end_ids
    from stages.eval import main

    work = tmp_path_factory.mktemp("eval")
    target = load_target(HiddenParams(device="cpu"))
    export_sglang(random_drafter(target), work / "drafter", info={"target": target.identity})
    (work / "gate.json").write_text(json.dumps({"success": True, "checks": 1, "failed": 0}))
    tokens_table(work / "tokens.parquet", smollm2_tok, PROMPTS[:2])
    contract(work / "contract.json", min(resolve_end_ids(smollm2_tok.hf)))
    rc = main(["--params", str(write_params(work / "params.yaml")), "--tokens", str(work / "tokens.parquet"),
               "--contract", str(work / "contract.json"), "--drafter", str(work / "drafter"),
               "--gate", str(work / "gate.json"), "--out", str(work / "out"),
               "--metrics", str(work / "metrics" / "eval.json"), "--plot", str(work / "plot.csv")])
    assert rc == 0
    return work


def gate(work: Path, outputs: Path, params: Path) -> tuple[int, dict]:
    from stages.gate_eval import main

    rc = main(["eval", str(outputs), "--input", f"tokens={work / 'tokens.parquet'}", "--params", str(params),
               "--no-docs", "--result", str(work / "result.json"), "--metric", str(work / "metric.json")])
    result = json.loads((work / "result.json").read_text())
    return rc, {e["kwargs"].get("column", e["type"]): e for e in result["expectations"]}


def test_the_stage_writes_numbers_only_metrics_with_drafter_and_ngram_figures(staged):
    m = json.loads((staged / "metrics" / "eval.json").read_text())
    for name in ("drafter", "ngram"):
        assert m[name]["acceptance_length"] >= 1.0
        assert m[name]["ci95"]["low"] <= m[name]["acceptance_length"] <= m[name]["ci95"]["high"]
    assert m["oracle"]["acceptance_length"] > 3.0           # k + 1 = 4 but for the last steps
    # The breakdowns, settings and second definitions are in the details only (dvc metrics show).
    assert not {"runs", "proxy", "k"} & set(m)
    assert set(m["drafter"]) == {"acceptance_length", "ci95"}
    details = json.loads((staged / "metrics" / "eval.details.json").read_text())
    assert set(details["drafter"]["per_position"]) == {"1", "2", "3"}
    assert details["ngram"]["settings"] == {"k": 3, "n_min": 5, "n_max": 5}
    assert "proxy_simulated_acceptance_length" in details["drafter"]
    assert details["ngram"]["setting"] == "ngram_5_5"
    assert details["ngram"]["best"]["setting"] in ("ngram_5_5", "ngram_1_2")
    # The sweep is replayed over verified ids: exact, so the default's replay is its measurement.
    assert details["ngram"]["sweep_replayed"]["ngram_5_5"] == m["ngram"]["acceptance_length"]
    best = details["ngram"]["best"]
    assert details["ngram"]["sweep_replayed"][best["setting"]] == best["acceptance_length"]
    assert (staged / "plot.csv").read_text().startswith("position,setting,acceptance_rate\n")


def test_the_outputs_hold_ids_and_step_counts_for_each_setting_and_heldout_prompt(staged):
    import pyarrow.parquet as pq

    t = pq.read_table(staged / "out" / "outputs.parquet").to_pylist()
    assert {"eagle3", "ngram_5_5", "oracle"} <= {r["setting"] for r in t} <= {"eagle3", "ngram_1_2", "ngram_5_5", "oracle"}
    assert {r["prompt_id"] for r in t} == {"h0", "h1"}              # never the training row h2
    assert all(1 + sum(r["emitted"]) == len(r["output_ids"]) for r in t)


def test_the_gate_passes_the_outputs_as_written(staged):
    rc, checks = gate(staged, staged / "out" / "outputs.parquet", staged / "params.yaml")
    assert rc == 0, {k: v for k, v in checks.items() if not v["success"]}


def test_one_changed_token_fails_the_gate(staged):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(staged / "out" / "outputs.parquet").to_pylist()
    victim = next(r for r in rows if r["setting"] == "oracle" and len(r["output_ids"]) > 6)
    victim["output_ids"][5] = (victim["output_ids"][5] + 1) % 49152
    bad = staged / "corrupt.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(staged / "out" / "outputs.parquet")), bad)
    rc, checks = gate(staged, bad, staged / "params.yaml")
    assert rc == 1
    failed = checks["diverges_from_greedy"]
    assert not failed["success"] and failed["unexpected_count"] == 1
    assert f"oracle: {victim['prompt_id']} leaves greedy at token 5" in failed["unexpected_sample"][0]


def test_a_training_prompt_in_the_outputs_fails_the_gate(staged):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(staged / "out" / "outputs.parquet").to_pylist()
    rows[0] = {**rows[0], "prompt_id": "h2"}
    bad = staged / "train_row.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(staged / "out" / "outputs.parquet")), bad)
    rc, checks = gate(staged, bad, staged / "params.yaml")
    assert rc == 1
    assert not checks["not_a_heldout_prompt"]["success"]
    assert not checks["setting_missing_prompts"]["success"]


def test_an_acceptance_floor_above_the_drafters_length_fails_the_gate(staged):
    rc, checks = gate(staged, staged / "out" / "outputs.parquet", write_params(staged / "high.yaml", floor=3.0))
    assert rc == 1
    floor = checks["drafter_acceptance_length"]
    assert not floor["success"] and 1.0 <= floor["observed_value"] < 3.0
    assert checks["diverges_from_greedy"]["success"]


def test_the_report_gives_acceptance_per_dataset_and_per_mode_with_intervals_and_the_mode_gap(staged):
    m = json.loads((staged / "metrics" / "eval.details.json").read_text())["drafter"]
    assert set(m["by_dataset"]) == {"set0", "set1"} and set(m["by_mode"]) == {"no_think"}
    assert [g["prompts"] for g in m["by_dataset"].values()] == [1, 1] and m["by_mode"]["no_think"]["prompts"] == 2
    for group in (*m["by_dataset"].values(), *m["by_mode"].values()):
        assert group["ci95"]["low"] <= group["acceptance_length"] <= group["ci95"]["high"]
    assert m["by_mode"]["no_think"]["acceptance_length"] == m["acceptance_length"]
    assert m["mode_gap"]["gap"] == 0.0       # one served mode: best and worst are the same
    details = json.loads((staged / "metrics" / "eval.details.json").read_text())
    assert details["drafter"]["mode_gap"] == {"unmeasured": [], "best": "no_think", "worst": "no_think", "gap": 0.0}


def test_a_per_mode_floor_fails_a_served_mode_below_it_or_without_held_out_prompts(staged):
    # The mode is recomputed from the prompt ids by the gate's check: SmolLM2's ChatML serves no_think,
    # which passes a floor of 1.0 (test_the_gate_passes_the_outputs_as_written) but not 3.0.
    rc, checks = gate(staged, staged / "out" / "outputs.parquet", write_params(staged / "m3.yaml", mode_floor=3.0))
    assert rc == 1 and "no_think" in checks["modes_below_floor"]["unexpected_sample"][0]
    # A profile that also serves thinking on, which no held-out prompt of this target is in.
    served = [{"thinking": False}, {"thinking": True}]
    rc, checks = gate(staged, staged / "out" / "outputs.parquet",
                      write_params(staged / "m4.yaml", mode_floor=1.0, served=served))
    assert rc == 1 and "think unmeasured" in checks["modes_below_floor"]["unexpected_sample"][0]


def test_a_divergence_to_the_runner_up_within_the_tolerance_is_counted_not_failed(staged, smollm2_tok):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate.config import HiddenParams
    from draftgate.evaluate.loop import greedy_decode
    from draftgate.evaluate.run import heldout_rows
    from draftgate.target import load_target

    schema = pq.read_schema(staged / "out" / "outputs.parquet")
    rows = pq.read_table(staged / "out" / "outputs.parquet").to_pylist()
    victim = next(r for r in rows if r["setting"] == "ngram_5_5" and len(r["output_ids"]) > 4)
    prompt = next(h.prompt for h in heldout_rows(staged / "tokens.parquet") if h.prompt_id == victim["prompt_id"])
    g = greedy_decode(load_target(HiddenParams(device="cpu")).model, "cpu", prompt, EVAL["max_new_tokens"],
                      frozenset())
    from draftgate.serve.model import resolve_end_ids

    end = resolve_end_ids(smollm2_tok.hf)
    # The last token: nothing follows the swap, so the runner-up is the only difference from greedy.
    at = next(i for i in reversed(range(2, len(victim["output_ids"]))) if g.top2[i][2] not in end)
    victim["output_ids"][at] = g.top2[at][2]             # the target's second choice there
    gap = g.top2[at][1] - g.top2[at][3]                  # its logit behind the first choice
    wide = gap + 1e-3
    bad = staged / "runner_up.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), bad)

    def params(tolerance: float, allowed: int) -> Path:
        path = staged / f"tie-{allowed}.yaml"
        path.write_text(yaml.safe_dump({"hidden": {"device": "cpu"}, "eval": EVAL, "gates": {"eval": {
            "min_acceptance_length": 1.0, "tie_tolerance": tolerance, "max_tie_divergences": allowed}}}))
        return path

    # A tolerance wider than the swap's logit gap makes it a tie: counted, and over a bound of 0.
    assert wide <= 10.0, f"the runner-up is {gap:.3f} logits behind: past gates.eval.tie_tolerance's range"
    rc, checks = gate(staged, bad, params(wide, 0))
    assert rc == 1 and checks["diverges_from_greedy"]["success"]
    assert checks["tie_divergences"]["observed_value"] == 1 and not checks["tie_divergences"]["success"]
    rc, checks = gate(staged, bad, params(wide, 1))
    assert rc == 0
    # With no tolerance the same swap is a failure.
    rc, checks = gate(staged, bad, params(0.0, 1))
    assert rc == 1 and not checks["diverges_from_greedy"]["success"]
