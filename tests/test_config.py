from pathlib import Path

import pytest

from draftgate.config import Params, ParamsError, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]


def test_repository_params_yaml_loads_into_typed_sections():
    params = load_params(REPO / "params.yaml")
    assert isinstance(params, Params)
    assert params.tokenizer.kind == "smollm2"
    assert params.template.name == "chatml"
    assert params.generate.backend == "local"


def test_repository_params_yaml_spells_out_every_key_of_every_section():
    # The embedded default must show every knob, so nothing runs on a hidden default.
    import dataclasses
    import typing

    import yaml

    def gaps(cls, section, prefix):
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            if f.name not in section:
                out.append(prefix + f.name)
            elif dataclasses.is_dataclass(hints[f.name]):
                out += gaps(hints[f.name], section[f.name], f"{prefix}{f.name}.")
        return out

    data = yaml.safe_load((REPO / "params.yaml").read_text())
    assert gaps(Params, data, "") == []


def test_unknown_key_names_its_dotted_path_and_the_allowed_keys():
    with pytest.raises(ParamsError) as e:
        parse_params({"tokenizer": {"kindd": "qwen3"}})
    assert "tokenizer.kindd: unknown key" in str(e.value)
    assert "kind, path, trust_remote_code, expected_ids" in str(e.value)


def test_unknown_section_is_an_error():
    with pytest.raises(ParamsError, match=r"genrate: unknown key"):
        parse_params({"genrate": {}})


@pytest.mark.parametrize("data, message", [
    ({"generate": {"concurrency": "many"}}, "generate.concurrency: expected int, got 'many'"),
    ({"generate": {"seed": True}}, "generate.seed: expected int, got True"),
    ({"template": {"name": "llama"}}, "template.name: 'llama' is not one of"),
    ({"gates": {"tokens": {"max_semantic": 0.5}}}, "gates.tokens.max_semantic: expected int"),
    ({"generate": {"price": {"prompt_usd_per_mtok": "free"}}}, "generate.price.prompt_usd_per_mtok"),
    ({"tokenizer": {"expected_ids": {"<|im_end|>": "163586"}}}, "tokenizer.expected_ids.<|im_end|>"),
    ({"contract": {"probe_pairs": "foo"}}, "contract.probe_pairs: expected a list"),
])
def test_mistyped_values_fail_with_their_dotted_path(data, message):
    with pytest.raises(ParamsError) as e:
        parse_params(data)
    assert message in str(e.value)


def test_ints_are_accepted_where_floats_are_expected_but_not_the_reverse():
    params = parse_params({"generate": {"budget_usd": 100, "temperature": 1}})
    assert params.generate.budget_usd == 100.0 and isinstance(params.generate.budget_usd, float)


def test_nullable_fields_accept_null_and_params_are_frozen():
    params = parse_params({"generate": {"seed": None, "provider": None}})
    assert params.generate.seed is None
    with pytest.raises(AttributeError):
        params.generate.seed = 1  # type: ignore[misc]


def test_missing_params_file_says_how_to_fix(tmp_path):
    with pytest.raises(ParamsError, match="pass --params"):
        load_params(tmp_path / "nope.yaml")


def test_invalid_yaml_names_the_file(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("tokenizer: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)


@pytest.mark.parametrize("data, message", [
    ({"generate": {"max_attempts": 0}}, "generate.max_attempts: 0 is out of range; allowed: >= 1"),
    ({"generate": {"limit": -1}}, "generate.limit: -1 is out of range; allowed: >= 1"),
    ({"generate": {"concurrency": 0}}, "generate.concurrency: 0 is out of range; allowed: >= 1"),
    ({"generate": {"budget_usd": -1}}, "generate.budget_usd: -1 is out of range; allowed: >= 0"),
    ({"generate": {"max_tokens": 0}}, "generate.max_tokens: 0 is out of range; allowed: >= 1"),
    ({"generate": {"timeout_s": 0}}, "generate.timeout_s: 0 is out of range; allowed: > 0"),
    ({"generate": {"temperature": 2.5}}, "generate.temperature: 2.5 is out of range; allowed: >= 0 and <= 2"),
    ({"generate": {"top_p": 0}}, "generate.top_p: 0 is out of range; allowed: > 0 and <= 1"),
    ({"generate": {"top_logprobs": 21}}, "generate.top_logprobs: 21 is out of range; allowed: >= 0 and <= 20"),
    ({"generate": {"seed": -3}}, "generate.seed: -3 is out of range; allowed: >= 0"),
    ({"generate": {"retry_base_s": -0.5}}, "generate.retry_base_s: -0.5 is out of range; allowed: >= 0"),
    ({"generate": {"price": {"completion_usd_per_mtok": -2}}},
     "generate.price.completion_usd_per_mtok: -2 is out of range; allowed: >= 0"),
    ({"prompts": {"heldout_fraction": 1.5}}, "prompts.heldout_fraction: 1.5 is out of range; allowed: >= 0 and <= 1"),
    ({"prompts": {"max_prompts": 0}}, "prompts.max_prompts: 0 is out of range; allowed: >= 1"),
    ({"serve": {"max_batch": 0}}, "serve.max_batch: 0 is out of range; allowed: >= 1"),
    ({"serve": {"batch_wait_ms": -1}}, "serve.batch_wait_ms: -1 is out of range; allowed: >= 0"),
    ({"tokenizer": {"expected_ids": {"<|im_end|>": -1}}}, "tokenizer.expected_ids.<|im_end|>: -1 is out of range"),
    ({"gates": {"tokens": {"max_mismatch_rate": 1.2}}}, "gates.tokens.max_mismatch_rate: 1.2 is out of range"),
    ({"gates": {"responses": {"max_cost_usd": -5}}}, "gates.responses.max_cost_usd: -5 is out of range"),
])
def test_a_number_outside_its_range_fails_with_the_allowed_range(data, message):
    with pytest.raises(ParamsError) as e:
        parse_params(data)
    assert message in str(e.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_in_every_float(value):
    with pytest.raises(ParamsError, match=r"generate.timeout_s: .* is not a finite number"):
        parse_params({"generate": {"timeout_s": value}})


def test_nan_from_yaml_is_refused_with_the_file_name(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("generate:\n  budget_usd: .nan\n")
    with pytest.raises(ParamsError, match=rf"{path}: generate.budget_usd: nan is not a finite number"):
        load_params(path)


def test_every_problem_in_the_file_is_reported_at_once():
    with pytest.raises(ParamsError) as e:
        parse_params({"generate": {"max_attempts": 0, "limit": -1, "colour": "red"},
                      "prompts": {"heldout_fraction": -0.1}})
    lines = str(e.value).splitlines()
    assert len(lines) == 4
    assert any("generate.colour: unknown key" in x for x in lines)
    assert any("generate.max_attempts: 0 is out of range" in x for x in lines)
    assert any("generate.limit: -1 is out of range" in x for x in lines)
    assert any("prompts.heldout_fraction: -0.1 is out of range" in x for x in lines)


def test_knobs_that_contradict_each_other_are_refused():
    with pytest.raises(ParamsError, match="generate.retry_max_s: 0.1 is below retry_base_s 0.5"):
        parse_params({"generate": {"retry_max_s": 0.1}})
    with pytest.raises(ParamsError, match="gates.prompts.min_heldout_fraction: 0.3 is above"):
        parse_params({"gates": {"prompts": {"min_heldout_fraction": 0.3}}})


def test_boundary_values_are_accepted():
    params = parse_params({"generate": {"max_attempts": 1, "concurrency": 1, "limit": 1, "budget_usd": 0,
                                        "temperature": 0, "top_p": 1, "seed": None},
                           "prompts": {"heldout_fraction": 0, "max_prompts": None}})
    assert (params.generate.max_attempts, params.generate.limit, params.prompts.heldout_fraction) == (1, 1, 0.0)


# ---------------------------------------------------------------- upper bounds

@pytest.mark.parametrize("data, message", [
    ({"generate": {"concurrency": 10**18}}, "generate.concurrency: 1000000000000000000 is out of range; "
                                            "allowed: >= 1 and <= 10000"),
    ({"generate": {"max_attempts": 1000}}, "generate.max_attempts: 1000 is out of range; allowed: >= 1 and <= 100"),
    ({"generate": {"max_tokens": 2**21}}, "generate.max_tokens: 2097152 is out of range; allowed: >= 1 and <= 1048576"),
    ({"generate": {"seed": 2**32}}, "generate.seed: 4294967296 is out of range; allowed: >= 0 and <= 4294967295"),
    ({"generate": {"timeout_s": 1e9}}, "generate.timeout_s: 1000000000.0 is out of range; allowed: > 0 and <= 86400"),
    ({"generate": {"budget_usd": 1e18}}, "generate.budget_usd: 1e+18 is out of range; allowed: >= 0 and <= 1000000"),
    ({"serve": {"max_batch": 10**6}}, "serve.max_batch: 1000000 is out of range; allowed: >= 1 and <= 4096"),
    ({"tokenizer": {"expected_ids": {"<|im_end|>": 2**31}}}, "tokenizer.expected_ids.<|im_end|>: 2147483648 is out "
                                                             "of range; allowed: >= 0 and <= 2147483647"),
    ({"reconstruct": {"billing": {"prompt": {"novita": 10**9}}}}, "reconstruct.billing.prompt.novita"),
    ({"prompts": {"context_tokens": 10**7}}, "prompts.context_tokens: 10000000 is out of range; "
                                             "allowed: >= 1 and <= 1048576"),
    ({"hidden": {"batch_tokens": 10**18}}, "hidden.batch_tokens: 1000000000000000000 is out of range"),
    ({"drafter": {"epochs": 10**18}}, "drafter.epochs: 1000000000000000000 is out of range; allowed: >= 1 and <= 1000"),
    ({"drafter": {"draft_vocab_size": 10**7}}, "drafter.draft_vocab_size: 10000000 is out of range; "
                                               "allowed: >= 1 and <= 1048576"),
    ({"drafter": {"weight_decay": 5.0}}, "drafter.weight_decay: 5.0 is out of range; allowed: >= 0 and <= 1"),
    ({"eval": {"bootstrap_samples": 10**18}}, "eval.bootstrap_samples: 1000000000000000000 is out of range; "
                                              "allowed: >= 100 and <= 1000000"),
    ({"eval": {"ngram_sweep": [[1, 10**6]]}}, "eval.ngram_sweep[0][1]: 1000000 is out of range; allowed: >= 1 and <= 256"),
    ({"gates": {"hidden": {"tolerance_eps": 1000.0}}}, "gates.hidden.tolerance_eps: 1000.0 is out of range"),
])
def test_a_number_past_what_the_machine_or_any_target_allows_fails_with_the_allowed_range(data, message):
    with pytest.raises(ParamsError) as e:
        parse_params(data)
    assert message in str(e.value)


def test_the_upper_bounds_themselves_are_accepted():
    params = parse_params({"generate": {"concurrency": 10_000, "max_tokens": 2**20 - 1, "seed": 2**32 - 1},
                           "drafter": {"epochs": 1000}, "eval": {"bootstrap_samples": 1_000_000},
                           "prompts": {"context_tokens": 2**20}})
    assert (params.generate.concurrency, params.drafter.epochs, params.eval.bootstrap_samples) == (10_000, 1000, 1_000_000)


# Numbers left without an upper bound, and why: a cap above the data is no cap (max_prompts,
# limit), a threshold on a count of rows may be as large as the rows (max_semantic,
# max_tie_divergences); min_compared's ceiling is the probe set's size (templates/probes.py, which
# params must not import: the template gate fails a value above it).
UNBOUNDED = {"prompts.max_prompts", "generate.limit", "eval.max_prompts",
             "gates.tokens.max_semantic", "gates.eval.max_tie_divergences",
             "gates.template.min_compared"}


def test_every_number_in_params_has_an_upper_bound_or_a_reason_not_to():
    import dataclasses
    import typing

    from draftgate.config import Range

    def bounded(tp) -> bool | None:
        """True/False for a numeric type (with/without an upper bound), None for anything else."""
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            if args[0] in (int, float):
                return any(isinstance(r, Range) and (r.le is not None or r.lt is not None) for r in tp.__metadata__)
            return bounded(args[0])
        if tp in (int, float):
            return False
        verdicts = [bounded(a) for a in args if a is not type(None)]
        verdicts = [v for v in verdicts if v is not None]
        return all(verdicts) if verdicts else None

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                yield from walk(tp, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}", bounded(tp)

    open_ended = {key for key, verdict in walk(Params, "") if verdict is False}
    assert open_ended == UNBOUNDED


def test_a_layer_named_twice_is_refused_in_the_params():
    with pytest.raises(ParamsError) as e:
        parse_params({"hidden": {"layers": [1, 1, 1]}})
    assert "hidden.layers: [1, 1, 1] names a layer twice" in str(e.value)
    assert parse_params({"hidden": {"layers": [1, 14, 26]}}).hidden.layers == [1, 14, 26]


def test_knobs_of_two_sections_that_cannot_both_hold_are_refused_naming_both():
    with pytest.raises(ParamsError, match=r"gates.eval.min_acceptance_length: 6.0 is above eval.k \+ 1 = 5"):
        parse_params({"eval": {"k": 4}, "gates": {"eval": {"min_acceptance_length": 6.0}}})
    with pytest.raises(ParamsError, match=r"generate.max_tokens: 8192 leaves no room for a prompt in the target's "
                                          r"context \(prompts.context_tokens 8192\)"):
        parse_params({"generate": {"max_tokens": 8192}, "prompts": {"context_tokens": 8192}})


def test_a_param_dvc_exp_run_set_to_off_reads_as_the_string_off(tmp_path):
    from draftgate.config import read_yaml

    # DVC writes `-S repair.backend=off` as a plain `off` (YAML 1.2); YAML 1.1 would read False.
    text = (Path(__file__).resolve().parents[1] / "params.yaml").read_text().replace("  backend: hf\n", "  backend: off\n", 1)
    assert "  backend: off\n" in text
    (tmp_path / "params.yaml").write_text(text)
    assert load_params(tmp_path / "params.yaml").repair.backend == "off"
    # ...and true/false still read as booleans.
    assert read_yaml("a: true\nb: off\nc: no\nd: False\n") == {"a": True, "b": "off", "c": "no", "d": False}


def test_an_off_that_a_yaml_1_1_reader_turned_into_false_is_refused_saying_to_quote_it():
    with pytest.raises(ParamsError, match=r"contract\.engine: False is not one of 'off', 'vllm' "
                                          r"\(a YAML 1\.1 reader took a bare off for false: quote it\)"):
        parse_params({"contract": {"engine": False}})


def test_a_bare_off_in_params_yaml_is_the_string_off(tmp_path):
    (tmp_path / "params.yaml").write_text("contract:\n  engine: off\nrepair:\n  backend: off\n")
    p = load_params(tmp_path / "params.yaml")
    assert (p.contract.engine, p.repair.backend) == ("off", "off")
