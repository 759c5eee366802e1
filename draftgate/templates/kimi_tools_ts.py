"""Kimi-K2.5's tool declarations: a TypeScript-style `namespace functions { ... }` block.

K2.5's tokenizer (tokenization_kimi.py) does not let the chat template serialise tools itself: its
apply_chat_template deep-sorts the tool dicts' keys, converts them with tool_declaration_ts.py and
hands the text to the template as `tools_ts_str`; when the conversion raises, or yields nothing
(no tool of type "function"), the template falls back to compact JSON. This module is our own
encoder for that text. It was checked byte for byte, offline, against the official
tool_declaration_ts.py (public copy: thinking-machines-lab/tinker-cookbook
`tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py` @ f46503488a5f, itself checked
against 13 outputs of the real K2.5 snapshot kept in lightseekorg/smg
`crates/tokenizer/tests/fixtures/kimi_k25/expected/`), on hand-made and random schemas.

The layout, for one function:

    # Tools

    ## functions
    namespace functions {
    // {function description, one `// ` line per line}
    type {name} = (_: {
      // {property description}
      // {constraint}: {value}, ...      (string: maxLength/minLength/pattern; number: maximum/minimum;
      // Default: {default}               array: maxItems/minItems)
      {required name}: {type},
      {optional name}?: {type},
      [k: string]: {additionalProperties type}
    }) => any;
    }

Required properties come first, each group sorted by name. Types: integer is `number`; arrays are
`Array<T>` (multi-line when the item type has a description or constraints); enums are
`"a" | 1 | True` (Python's str() of non-strings, strings quoted but not escaped); anyOf and type
lists are ` | ` unions; `$ref: "#/$defs/X"` names `X` and each definition becomes an
`interface X {...}` above the function; a `$ref: "#"` (recursion to the root) turns the
parameters into `interface parameters {...}` listed in schema order. `oneOf`, `allOf`, `not`
and a `$ref` anywhere else are not understood: the encoder raises, as the official one does, and
the caller falls back to JSON. Everything here mirrors the official behaviour, quirks included
(an enum's constraints are never shown, a nested anyOf member's description is dropped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

INDENT = "  "
FIELD_SEP = ",\n"

# Per scalar type, the keywords shown as a `// k: v, ...` constraint line.
SCALAR_CONSTRAINTS = {"string": ("maxLength", "minLength", "pattern"),
                      "number": ("maximum", "minimum"), "integer": ("maximum", "minimum")}
ARRAY_CONSTRAINTS = ("maxItems", "minItems")
# A `type: [...]` list is rendered through this table; any other name is an error.
UNION_NAMES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
               "null": "null", "object": "{}", "array": "Array<any>"}


class TSDeclarationError(ValueError):
    """A schema the TypeScript encoder does not understand; K2.5's tokenizer then declares JSON."""


def comment_lines(text: str, indent: str = "") -> str:
    # Empty lines stay empty (no "// " on them).
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


# ---------------------------------------------------------------- parsed schema nodes

@dataclass
class Node:
    description: Any
    constraints: dict

    def doc(self, indent: str) -> str:
        """The comment lines above a field of this type (each ending in a newline), or ''."""
        out = ""
        if self.description:
            out += comment_lines(self.description, indent) + "\n"
        if self.constraints:
            out += indent + "// " + ", ".join(f"{k}: {v}" for k, v in sorted(self.constraints.items(),
                                                                             key=lambda kv: kv[0])) + "\n"
        return out

    def ts(self, indent: str = "") -> str:
        raise NotImplementedError


def _node_fields(schema: dict, keys: tuple[str, ...] = ()) -> tuple[Any, dict]:
    return schema.get("description", ""), {k: v for k, v in schema.items() if k in keys}


@dataclass
class Scalar(Node):
    type: Any

    def ts(self, indent: str = "") -> str:
        return "number" if self.type == "integer" else self.type


@dataclass
class Field:
    name: str
    type: Node
    optional: bool
    default: Any

    def ts(self, indent: str) -> str:
        head = self.type.doc(indent)
        if self.default is not None:
            shown = (repr(self.default) if isinstance(self.default, (int, float, bool))
                     else json.dumps(self.default, ensure_ascii=False))
            head += f"{indent}// Default: {shown}\n"
        return f"{head}{indent}{self.name}{'?' if self.optional else ''}: {self.type.ts(indent=indent)}"


@dataclass
class Object(Node):
    fields: list
    extra: Any          # additionalProperties: None (absent), a bool, a Node, or anything else (an error)

    def ts(self, indent: str = "") -> str:
        inner = indent + INDENT
        ordered = (sorted((f for f in self.fields if not f.optional), key=lambda f: f.name)
                   + sorted((f for f in self.fields if f.optional), key=lambda f: f.name))
        lines = [f.ts(inner) for f in ordered]
        if self.extra is not None:
            if self.extra is True:
                extra = "any"
            elif self.extra is False:
                extra = "never"
            elif isinstance(self.extra, Node):
                extra = self.extra.ts(indent=inner)
            else:
                raise TSDeclarationError(f"additionalProperties must be a bool or a schema, got {self.extra!r}")
            lines.append(f"{inner}[k: string]: {extra}")
        if not lines:
            return "{}"
        return "{\n" + FIELD_SEP.join(lines) + "\n" + indent + "}"


@dataclass
class Array(Node):
    item: Node

    def ts(self, indent: str = "") -> str:
        inner = indent + INDENT
        item_doc = self.item.doc(inner)
        if item_doc:
            return "Array<\n" + item_doc + inner + self.item.ts(indent=inner) + "\n" + indent + ">"
        return f"Array<{self.item.ts(indent=indent)}>"


@dataclass
class Enum(Node):
    values: Any

    def ts(self, indent: str = "") -> str:
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in self.values)


@dataclass
class Union(Node):
    members: list       # Nodes (anyOf) or already-rendered names (type lists)

    def ts(self, indent: str = "") -> str:
        return " | ".join(m.ts(indent=indent) if isinstance(m, Node) else m for m in self.members)


@dataclass
class Ref(Node):
    name: str

    def ts(self, indent: str = "") -> str:
        return self.name


# ---------------------------------------------------------------- schema -> nodes

class Definitions:
    """The `$defs` met so far in one function's parameters (any nesting level), in order met."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}
        self.root_referenced = False

    def add(self, defs: Any) -> None:
        if defs:
            for name, schema in defs.items():
                self.schemas[name] = schema

    def resolve(self, ref: Any) -> str:
        if ref == "#":
            self.root_referenced = True
            return "parameters"
        if ref.startswith("#/$defs/"):
            name = ref.split("/")[-1]
            if name not in self.schemas:
                raise TSDeclarationError(f"$ref {ref!r} names no definition")
            target = self.schemas[name]
            # A definition that is itself a root marker would also read "parameters"; plain dicts never are.
            return "parameters" if target.get("$self_ref", False) else name
        raise TSDeclarationError(f"$ref {ref!r}: only '#' and '#/$defs/NAME' are understood")


def _check_enum(schema: dict) -> None:
    if "type" not in schema:
        return
    declared = schema["type"]
    if isinstance(declared, list):
        if len(declared) == 1:
            declared = declared[0]
        elif len(declared) == 2 and "null" in declared:
            declared = declared[0] if declared[0] != "null" else declared[1]
        else:
            raise TSDeclarationError(f"enum with type {declared!r}: only one type, optionally with null")
    # (A comparison chain, not a dict lookup: a malformed unhashable type is accepted, as upstream.)
    wanted = (str if declared == "string" else (int, float) if declared == "number"
              else int if declared == "integer" else bool if declared == "boolean" else None)
    for value in schema["enum"]:
        if value is not None and wanted is not None and not isinstance(value, wanted):
            raise TSDeclarationError(f"enum value {value!r} is not of type {declared}")


def parse_object(schema: Any, defs: Definitions) -> Object:
    description, _ = _node_fields(schema)
    node = Object(description, {}, [], None)
    if not schema:
        return node
    if "$defs" in schema:
        defs.add(schema["$defs"])
    extra = schema.get("additionalProperties")
    node.extra = parse_schema(extra, defs) if isinstance(extra, dict) else extra
    if "properties" not in schema:
        return node
    props = schema["properties"]
    optional = set(props.keys()) - set(schema.get("required", []))
    node.fields = [Field(name, parse_schema(prop, defs), name in optional,
                         prop.get("default") if isinstance(prop, dict) else None)
                   for name, prop in props.items()]
    return node


def parse_schema(schema: Any, defs: Definitions) -> Node:
    if isinstance(schema, bool):
        # `true` accepts anything; `false` nothing, which the official encoder writes as null.
        return Scalar("", {}, "any" if schema else "null")
    if not isinstance(schema, dict):
        raise TSDeclarationError(f"a JSON schema must be an object or a bool, got {schema!r}")
    if "$ref" in schema:
        description, _ = _node_fields(schema)
        return Ref(description, {}, defs.resolve(schema["$ref"]))
    if "anyOf" in schema:
        description, _ = _node_fields(schema)
        return Union(description, {}, [parse_schema(s, defs) for s in schema["anyOf"]])
    if "enum" in schema:
        description, _ = _node_fields(schema)
        values = schema["enum"]
        _check_enum(schema)
        return Enum(description, {}, values)
    if "type" in schema:
        declared = schema["type"]
        if isinstance(declared, list):
            description, _ = _node_fields(schema)
            try:
                names = [UNION_NAMES[t] for t in declared]
            except (KeyError, TypeError):
                raise TSDeclarationError(
                    f"type list {declared!r}: each must be one of {', '.join(UNION_NAMES)}") from None
            return Union(description, {}, names)
        if declared == "object":
            return parse_object(schema, defs)
        if declared == "array":
            description, constraints = _node_fields(schema, ARRAY_CONSTRAINTS)
            items = schema.get("items")
            return Array(description, constraints, parse_schema(items, defs) if items else Scalar("", {}, "any"))
        keys = SCALAR_CONSTRAINTS.get(declared, ()) if isinstance(declared, str) else ()
        description, constraints = _node_fields(schema, keys)
        return Scalar(description, constraints, declared)
    if schema == {}:
        return Scalar("", {}, "any")
    raise TSDeclarationError(f"schema {schema!r} has no type, enum, anyOf or $ref "
                             "(oneOf/allOf are not understood)")


# ---------------------------------------------------------------- functions -> text

def function_ts(function: dict) -> str:
    defs = Definitions()
    params = parse_object(function.get("parameters") or {}, defs)
    interfaces = []
    recursive = defs.root_referenced
    if recursive:
        # Schema order here (not required-first), and no additionalProperties line.
        body = FIELD_SEP.join(f.ts(indent=INDENT) for f in params.fields)
        interfaces.append("interface parameters {" + (f"\n{body}\n" if body else "") + "}")
    for name, schema in dict(defs.schemas).items():
        body = parse_schema(schema, defs).ts()
        described = schema.get("description", "")
        interfaces.append((comment_lines(described) + "\n" if described else "") + f"interface {name} {body}")
    fname = function.get("name", "function")
    signature = "parameters" if recursive else params.ts()
    description = function.get("description")
    parts = ["\n".join(interfaces), (description and comment_lines(description)) or "",
             f"type {fname} = (_: {signature}) => any;"]
    return "\n".join(p for p in parts if p)


def encode_tools_ts(tools: list[dict]) -> str:
    """The `tools_ts_str` K2.5's tokenizer computes; '' when no tool is a function (JSON then)."""
    if not tools:
        return ""
    functions = [function_ts(t.get("function", {})) for t in tools
                 if t.get("type") == "function" and t.get("function", {})]
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"


# ---------------------------------------------------------------- the tokenizer hook

def deep_sorted(x: Any) -> Any:
    """Dict keys sorted at every level, lists kept in order (tokenization_kimi.py's deep sort)."""
    if isinstance(x, dict):
        return {k: deep_sorted(v) for k, v in sorted(x.items())}
    if isinstance(x, list):
        return [deep_sorted(v) for v in x]
    return x


def compact_json_declaration(tools: list[dict]) -> str:
    # The template's fallback: `tools | tojson(separators=(',', ':'))` on the deep-sorted tools.
    return json.dumps(deep_sorted(tools), ensure_ascii=False, separators=(",", ":"))


def ts_declaration(tools: list[dict]) -> str:
    """What K2.5's official tokenizer declares: the TypeScript text, or compact JSON when the
    encoder gives up (any error, as the tokenizer catches them all) or has nothing to say."""
    tools = deep_sorted(tools)
    try:
        text = encode_tools_ts(tools)
    except Exception:  # noqa: BLE001 - mirrors the tokenizer's catch-all fallback
        text = ""
    return text or compact_json_declaration(tools)
