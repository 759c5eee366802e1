"""K2.5's TypeScript-style tool declarations: hand-written goldens (each checked offline against the
official tool_declaration_ts.py), the refusals that send K2.5's tokenizer to JSON, and the hook."""

from __future__ import annotations

import pytest

from draftgate.templates.kimi_tools_ts import (
    TSDeclarationError, compact_json_declaration, deep_sorted, encode_tools_ts, ts_declaration,
)

HEAD = "# Tools\n\n## functions\nnamespace functions {\n"
TAIL = "\n}\n"


def tool(name, parameters=None, description=None):
    fn = {"name": name}
    if parameters is not None:
        fn["parameters"] = parameters
    if description is not None:
        fn["description"] = description
    return {"type": "function", "function": fn}


def obj(properties, required=(), **extra):
    return {"type": "object", "properties": properties, "required": list(required), **extra}


def test_a_function_without_parameters_takes_an_empty_object():
    assert encode_tools_ts([tool("ping")]) == HEAD + "type ping = (_: {}) => any;" + TAIL
    assert encode_tools_ts([tool("ping", {})]) == HEAD + "type ping = (_: {}) => any;" + TAIL


def test_required_fields_come_first_then_optional_ones_each_sorted_by_name():
    params = obj({"zeta": {"type": "string"}, "alpha": {"type": "boolean"}, "mid": {"type": "integer"},
                  "beta": {"type": "number"}}, required=["zeta", "mid"])
    assert encode_tools_ts([tool("f", params)]) == HEAD + (
        "type f = (_: {\n  mid: number,\n  zeta: string,\n  alpha?: boolean,\n  beta?: number\n}) => any;") + TAIL


def test_descriptions_constraints_and_defaults_become_comment_lines_above_the_field():
    params = obj({
        "city": {"type": "string", "description": "City name", "maxLength": 40, "minLength": 1},
        "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 3},
        "unit": {"type": "string", "default": "celsius"},
        "ratio": {"type": "number", "default": 0.5},
        "strict": {"type": "boolean", "default": False},
    }, required=["city"])
    assert encode_tools_ts([tool("weather", params, "Get the weather.\n\nUses a free API.")]) == HEAD + (
        "// Get the weather.\n\n// Uses a free API.\n"
        "type weather = (_: {\n"
        "  // City name\n  // maxLength: 40, minLength: 1\n  city: string,\n"
        "  // maximum: 7, minimum: 1\n  // Default: 3\n  days?: number,\n"
        "  // Default: 0.5\n  ratio?: number,\n"
        "  // Default: False\n  strict?: boolean,\n"
        '  // Default: "celsius"\n  unit?: string\n'
        "}) => any;") + TAIL


def test_nested_objects_indent_by_two_spaces_and_keep_their_description():
    params = obj({"when": obj({"depart": {"type": "string"}, "back": {"type": "string"}}, ["depart"],
                              description="Travel dates")}, ["when"])
    assert encode_tools_ts([tool("f", params)]) == HEAD + (
        "type f = (_: {\n  // Travel dates\n  when: {\n    depart: string,\n    back?: string\n  }\n}) => any;") + TAIL


def test_arrays_are_inline_unless_the_item_type_has_comments():
    params = obj({
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "any": {"type": "array"},
        "codes": {"type": "array", "items": {"type": "string", "description": "IATA code", "maxLength": 3}},
    })
    assert encode_tools_ts([tool("f", params)]) == HEAD + (
        "type f = (_: {\n"
        "  any?: Array<any>,\n"
        "  codes?: Array<\n    // IATA code\n    // maxLength: 3\n    string\n  >,\n"
        "  // maxItems: 5\n  tags?: Array<string>\n"
        "}) => any;") + TAIL


def test_enums_anyof_and_type_lists_are_unions():
    params = obj({
        "unit": {"type": "string", "enum": ["c", "f"], "description": "Unit", "maxLength": 1},
        "mixed": {"enum": [1, 2.5, True, None, "x"]},
        "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "many": {"type": ["integer", "object", "array", "null"]},
    })
    assert encode_tools_ts([tool("f", params)]) == HEAD + (
        "type f = (_: {\n"
        "  many?: number | {} | Array<any> | null,\n"
        "  maybe?: string | null,\n"
        '  mixed?: 1 | 2.5 | True | None | "x",\n'
        '  // Unit\n  unit?: "c" | "f"\n'          # an enum shows its description, never its constraints
        "}) => any;") + TAIL


def test_additional_properties_add_an_index_signature():
    params = obj({"m": {"type": "object", "additionalProperties": {"type": "integer"}},
                  "closed": {"type": "object", "additionalProperties": False},
                  "open": {"type": "object", "additionalProperties": True, "properties": {"k": {"type": "string"}}}})
    assert encode_tools_ts([tool("f", params)]) == HEAD + (
        "type f = (_: {\n"
        "  closed?: {\n    [k: string]: never\n  },\n"
        "  m?: {\n    [k: string]: number\n  },\n"
        "  open?: {\n    k?: string,\n    [k: string]: any\n  }\n"
        "}) => any;") + TAIL


def test_defs_become_interfaces_above_the_function_and_refs_name_them():
    airport = obj({"code": {"type": "string"}}, ["code"], description="An airport")
    params = obj({"origin": {"$ref": "#/$defs/Airport"},
                  "stops": {"type": "array", "items": {"$ref": "#/$defs/Airport"}}},
                 ["origin"], **{"$defs": {"Airport": airport}})
    assert encode_tools_ts([tool("fly", params, "Book.")]) == HEAD + (
        "// An airport\ninterface Airport {\n  code: string\n}\n"
        "// Book.\n"
        "type fly = (_: {\n  origin: Airport,\n  stops?: Array<Airport>\n}) => any;") + TAIL


def test_a_reference_to_the_root_turns_the_parameters_into_an_interface_in_schema_order():
    params = obj({"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}, ["name"])
    assert encode_tools_ts([tool("tree", params)]) == HEAD + (
        "interface parameters {\n  name: string,\n  children?: Array<parameters>\n}\n"
        "type tree = (_: parameters) => any;") + TAIL


def test_unicode_is_written_as_is_and_two_tools_are_one_namespace():
    ville = {"type": "string", "description": "東京 or Zürich 🤖", "default": "Zürich"}
    tools = [tool("météo", obj({"ville": ville}),
                  "Prévisions"), tool("ping")]
    assert encode_tools_ts(tools) == HEAD + (
        "// Prévisions\ntype météo = (_: {\n  // 東京 or Zürich 🤖\n  // Default: \"Zürich\"\n"
        "  ville?: string\n}) => any;\n"
        "type ping = (_: {}) => any;") + TAIL


def test_an_unknown_scalar_type_is_passed_through_and_integer_reads_number():
    params = obj({"d": {"type": "date"}, "n": {"type": "integer"}}, ["d", "n"])
    assert encode_tools_ts([tool("f", params)]) == HEAD + "type f = (_: {\n  d: date,\n  n: number\n}) => any;" + TAIL


def test_tools_that_are_not_functions_are_skipped_and_none_left_gives_empty_text():
    assert encode_tools_ts([{"type": "_plugin", "_plugin": {"name": "web"}}]) == ""
    assert encode_tools_ts([]) == ""


@pytest.mark.parametrize("schema, match", [
    ({"oneOf": [{"type": "string"}, {"type": "number"}]}, "oneOf/allOf are not understood"),
    ({"$ref": "#/definitions/X"}, "only '#' and '#/\\$defs/NAME'"),
    ({"$ref": "#/$defs/Missing"}, "names no definition"),
    ({"type": ["string", "any"]}, "type list"),
    ({"type": "string", "enum": [1]}, "is not of type string"),
    ({"type": "object", "additionalProperties": 5}, "additionalProperties"),
    ("string", "must be an object or a bool"),
])
def test_schemas_the_official_encoder_rejects_are_rejected(schema, match):
    with pytest.raises(TSDeclarationError, match=match):
        encode_tools_ts([tool("f", obj({"v": schema}))])


def test_the_hook_sorts_keys_deeply_then_declares_typescript_or_compact_json_when_the_encoder_gives_up():
    good = [tool("f", {"type": "object", "properties": {"b": {"type": "string"}}})]
    assert ts_declaration(good) == encode_tools_ts(good)
    bad = [tool("f", obj({"v": {"oneOf": [{"type": "string"}]}}))]
    assert ts_declaration(bad) == compact_json_declaration(bad) == (
        '[{"function":{"name":"f","parameters":{"properties":{"v":{"oneOf":[{"type":"string"}]}},'
        '"required":[],"type":"object"}},"type":"function"}]')
    plugin = [{"type": "_plugin", "_plugin": {"b": 1, "a": "é"}}]
    assert ts_declaration(plugin) == '[{"_plugin":{"a":"é","b":1},"type":"_plugin"}]'


def test_deep_sort_orders_keys_at_every_level_and_keeps_list_order():
    assert list(deep_sorted({"b": {"d": 1, "c": [{"z": 1, "y": 2}]}, "a": 0})) == ["a", "b"]
    assert deep_sorted({"b": {"d": 1, "c": [{"z": 1, "y": 2}]}}) == {"b": {"c": [{"y": 2, "z": 1}], "d": 1}}
    assert list(deep_sorted({"b": {"d": 1, "c": 2}})["b"]) == ["c", "d"]
