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
