"""Stage metrics: the numbers in metrics/<stage>.json (a DVC metric), every word in the details beside it."""

from __future__ import annotations

import json

from draftgate.metrics import StageMetrics, details_path, numbers


def a_stage() -> StageMetrics:
    m = StageMetrics("reconstruct", rows_in=4, rows_out=2,
                     params={"reconstruct": {"method": "auto", "request_rules": ["kimi"]}, "seed": 0},
                     figures={"match": {"exact": 1, "unknown": 1}, "mismatch_rate": 0.5, "ok": True,
                              "stop_reason": None, "template": "chatml", "nan_rate": float("nan"),
                              "quarantine_examples": {"reasoning_encrypted": "p2: a long answer ..."},
                              "billing": {"by_provider": {"local": {"rows": 2, "completion": "counts_end"}}},
                              "normalisations": {}, "probe_pairs": [["a", "b"]]})
    m.drop("reasoning_encrypted")
    m.drop("response_failed:http_500")
    return m


def test_the_metric_file_holds_the_numbers_and_the_details_file_everything(tmp_path):
    path = tmp_path / "metrics" / "reconstruct.json"

    a_stage().write(path)

    assert json.loads(path.read_text()) == {
        "rows_in": 4, "rows_out": 2, "dropped": 2,
        "drops_by_reason": {"reasoning_encrypted": 1, "response_failed:http_500": 1},
        "match": {"exact": 1, "unknown": 1}, "mismatch_rate": 0.5, "ok": True, "normalisations": {}}
    details = json.loads(details_path(path).read_text())
    assert details_path(path).name == "reconstruct.details.json"
    assert details["params"]["reconstruct"]["request_rules"] == ["kimi"] and details["template"] == "chatml"
    assert details["quarantine_examples"] == {"reasoning_encrypted": "p2: a long answer ..."}
    assert details["billing"] == {"by_provider": {"local": {"rows": 2, "completion": "counts_end"}}}
    assert details["stage"] == "reconstruct" and details["rows_out"] == 2


def test_numbers_keep_an_empty_count_and_drop_objects_of_text_only():
    assert numbers({"drops_by_reason": {}, "official": {"source": "x.gguf"}, "n": 3, "xs": [1, 2], "none": None}) \
        == {"drops_by_reason": {}, "n": 3}


def test_the_runs_own_figures_stay_out_of_the_dvc_metric_and_in_the_details(tmp_path):
    # Wall-clock, throughput and how a rerun resumed change on every run: in the metric they
    # would fill `dvc metrics diff` and `dvc exp show --only-changed` with noise.
    from draftgate.metrics import StageMetrics

    m = StageMetrics("hidden", 4, 4, figures={"tokens": 100, "elapsed_s": 3.2, "tokens_per_s": 31.2,
                                               "world_size": 2, "resumed_shards": 1, "bytes_per_token": 4608,
                                               "phases": {"base": {"seconds": 1.5, "tokens": 90}}})
    m.write(tmp_path / "hidden.json")
    metric = json.loads((tmp_path / "hidden.json").read_text())
    details = json.loads((tmp_path / "hidden.details.json").read_text())
    assert metric == {"rows_in": 4, "rows_out": 4, "dropped": 0, "drops_by_reason": {}, "tokens": 100,
                      "bytes_per_token": 4608}
    assert (details["elapsed_s"], details["world_size"], details["phases"]["base"]["seconds"]) == (3.2, 2, 1.5)


def test_breakdowns_and_a_stages_own_details_only_keys_stay_out_of_the_dvc_metric(tmp_path):
    # DVC prints one column per key of every metric file: eval's per-setting runs and its per
    # dataset, mode and position figures made 200 columns of one table.
    m = StageMetrics("eval", 2, 6, details_only=("tokens",), figures={
        "drafter": {"acceptance_length": 1.2, "tokens": 90, "by_dataset": {"chat": {"acceptance_length": 1.1}},
                    "per_position": {"1": 0.2}},
        "runs": {"eagle3": {"acceptance_length": 1.2}}})
    m.write(tmp_path / "eval.json")
    metric = json.loads((tmp_path / "eval.json").read_text())
    details = json.loads((tmp_path / "eval.details.json").read_text())
    assert metric == {"rows_in": 2, "rows_out": 6, "dropped": 0, "drops_by_reason": {},
                      "drafter": {"acceptance_length": 1.2}}
    assert details["drafter"]["tokens"] == 90 and details["drafter"]["per_position"] == {"1": 0.2}
    assert details["runs"] == {"eagle3": {"acceptance_length": 1.2}}
