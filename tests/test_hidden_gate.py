"""The hidden gate (expectations/hidden.json + draftgate/gates/hidden.py) on real SmolLM2 features.

Three chat prompts answered greedily by the local SmolLM2, their features captured by the hidden
package's capture code into a draftgate.hidden/1 directory: the gate passes. Then each corruption
a buggy or crashed extractor could leave is written as a self-consistent artifact (shards, index
and manifest agree with each other, as a producer with that bug would write them), and the gate
fails on exactly the check that sees it: a dropped row, a shifted id, a NaN, features shifted by
one position, a wrong layer list, features from perturbed weights.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from test_hidden_gate_files import capture_features, greedy_world, run_hidden_gate, write_hidden_dir


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tokens table (3 kept greedy rows + 1 quarantined), params with temperature 0, clean features."""
    return greedy_world(tmp_path_factory.mktemp("hidden_gate"))


def gate(world, hidden_dir):
    return run_hidden_gate(hidden_dir, world["tokens"], world["params"])


def failed(result) -> set[str]:
    """The subjects (columns) of the failed expectations."""
    return {e["kwargs"].get("column", e["type"]) for e in result["expectations"] if not e["success"]}


def variant(world, name, rows, **manifest):
    out = world["root"] / name
    shutil.rmtree(out, ignore_errors=True)
    write_hidden_dir(out, rows, world["tokens"], **manifest)
    return out


def test_the_gate_passes_on_clean_features_and_reports_per_dataset_logprobs(world):
    result = gate(world, world["clean"])
    assert failed(result) == set(), json.dumps(result["expectations"], indent=1)[:3000]
    report = result["computed"]["report"]
    assert set(report["mean_completion_logprob"]) == {"chat", "code"}
    assert all(v < 0 for v in report["mean_completion_logprob"].values())
    assert report["explained_share"] == 1.0                  # greedy rows: every token is the argmax
    assert len(report["resampled"]) == 3
    assert all(r["aux_error"] < 4e-3 and r["final_error"] < 4e-3 for r in report["resampled"])  # bf16 rounding


def test_a_dropped_row_fails_as_a_kept_row_without_features(world):
    out = variant(world, "dropped", world["features"][:-1])
    assert failed(gate(world, out)) == {"kept_row_without_features"}


def test_features_for_a_quarantined_row_fail_as_features_without_a_kept_row(world):
    extra = copy.deepcopy(world["features"][0])
    extra.prompt_id = "quarantined"         # same ids as p0, but the tokens table quarantined it
    out = variant(world, "quarantined", world["features"] + [extra])
    assert failed(gate(world, out)) == {"features_without_kept_row"}


def test_a_row_stored_twice_fails(world):
    out = variant(world, "twice", world["features"] + [copy.deepcopy(world["features"][2])])
    assert "row_stored_twice" in failed(gate(world, out))


def test_a_shifted_id_fails_the_ids_comparison(world):
    rows = copy.deepcopy(world["features"])
    ids = rows[1].input_ids
    ids[5] = (ids[5] + 1) % 49152
    assert "ids_differ" in failed(gate(world, variant(world, "shifted_id", rows)))


def test_a_nan_fails_finiteness(world):
    rows = copy.deepcopy(world["features"])
    rows[2].aux[3, 1, 7] = float("nan")
    assert failed(gate(world, variant(world, "nan", rows))) >= {"non_finite_features"}


def test_features_shifted_by_one_position_do_not_explain_the_tokens(world):
    import torch

    rows = copy.deepcopy(world["features"])
    for r in rows:   # an off-by-one in the extractor: position t holds the state of t+1
        r.aux = torch.cat([r.aux[1:], r.aux[-1:]])
        r.final = torch.cat([r.final[1:], r.final[-1:]])
    assert {"greedy_explained_share", "reextraction_differs"} <= failed(gate(world, variant(world, "shifted", rows)))


def test_features_from_a_wrong_layer_list_fail_the_reextraction_and_every_rows_first_layers(world):
    rows = capture_features(world["kept"], layers=[2, 14, 26])
    # The manifest claims the configured layers: only the forward passes can tell (the sample's
    # re-extraction, and every row's first layers against its lowest slot).
    assert failed(gate(world, variant(world, "wrong_layers", rows))) == {"reextraction_differs", "aux_not_this_row"}


def test_a_manifest_that_names_another_layer_list_fails(world):
    out = variant(world, "claims_other_layers", capture_features(world["kept"], layers=[2, 14, 26]),
                  layers=[2, 14, 26])
    assert {"layers_match", "reextraction_differs"} <= failed(gate(world, out))


def test_features_from_perturbed_weights_fail(world):
    rows = capture_features(world["kept"], perturb=0.05)
    fails = failed(gate(world, variant(world, "perturbed", rows)))
    assert "reextraction_differs" in fails and "greedy_explained_share" in fails


def test_another_sequences_features_under_a_rows_ids_fail_that_row(world):
    rows = copy.deepcopy(world["features"])
    bad = world["kept"][1]
    n_prompt = bad["loss_mask"].index(1)
    # Features of the same prompt followed by the other completion tokens in reverse: same length,
    # same prompt states, wrong completion states (a writer that mixed up two rows of one batch).
    other = dict(bad, input_ids=bad["input_ids"][:n_prompt] + bad["input_ids"][n_prompt:][::-1])
    swapped = capture_features([other])[0]
    rows[1].aux, rows[1].final = swapped.aux, swapped.final
    fails = failed(gate(world, variant(world, "swapped", rows)))
    assert "row_explained_share" in fails


def test_a_shard_changed_after_the_manifest_fails_its_hash(world):
    out = world["root"] / "tampered"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(world["clean"], out)
    shard = next(out.glob("shard-*.safetensors"))
    data = bytearray(shard.read_bytes())
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    start = 8 + int.from_bytes(data[:8], "little") + header["aux"]["data_offsets"][0]
    data[start + 100] ^= 0x01        # the lowest mantissa bit of one bfloat16 aux value (little-endian)
    shard.write_bytes(bytes(data))
    assert failed(gate(world, out)) == {"shards_hash_mismatch"}


def test_features_for_another_tokens_table_fail_the_tokens_hash(world):
    out = variant(world, "other_tokens", world["features"], tokens_sha256="0" * 64)
    assert failed(gate(world, out)) == {"tokens_hash_matches"}


def test_a_suite_naming_a_check_its_command_was_not_given_gets_no_verdict_naming_the_stage(tmp_path, capsys):
    from draftgate.gates.compute import run_check
    from draftgate.gates.suite import GateError, parse_suite
    from draftgate.gates.validate import main as validate

    with pytest.raises(GateError, match="'os.system' needs a check this command was not given \\(given: hidden\\)"):
        run_check("os.system", {"hidden": lambda inputs, params: None}, {}, "params.yaml")
    # `draftgate validate` is for SQL-only suites: the hidden suite points at its gate stage.
    params = tmp_path / "params.yaml"
    params.write_text("{}\n")
    assert validate(["hidden", str(tmp_path), "--no-docs", "--params", str(params)]) == 2
    assert "python -m stages.gate_hidden" in capsys.readouterr().err
    with pytest.raises(GateError, match="needs a \"view\""):
        parse_suite({"name": "x", "compute": "hidden",
                     "expectations": [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}}]})


def test_the_gate_without_a_hidden_directory_says_which_stage_to_run(world):
    from draftgate.gates.suite import GateError

    with pytest.raises(GateError, match="run the hidden stage"):
        run_hidden_gate(world["root"] / "absent", world["tokens"], world["params"])
