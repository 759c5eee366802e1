"""A gate's suite: plain JSON in expectations/<name>.json -> a typed Suite.

    {"name": "tokens",                      # also the artifact's input name, unless NAME=PATH
     "params_section": "tokens",            # gates.<section> of params.yaml (default: name)
     "table": "checks",                     # JSON document artifact: validate the list under it
     "view": "SELECT ... FROM tokens",      # DuckDB SQL over the named inputs (or a list of lines)
     "compute": "hidden",                   # a check's side tables, for the view; the gate stage passes it (compute.py)
     "relations": [{"name": "x", "sql": "SELECT ..."},              # named relations the view reads,
                   {"name": "agg", "sql": "...", "materialize": true}],   # in order (see Relation)
     "meta": {"why": "...",                 # the gate's purpose, on its page and in the Data Docs
              "docs": "docs/pipeline.md"},  # the page that explains it and its fixes, from the repo root
     "expectations": [{"type": "expect_column_values_to_not_be_null",
                       "kwargs": {"column": "prompt_id"}, "meta": {...}}]}

A kwarg {"$PARAMETER": "field"} takes the value of gates.<section>.field; the suite GX runs (and
the Data Docs show) holds the resolved value. columns_read() says which columns the suite reads,
so the table loader (table.py) decodes only those.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DOCS_RE = re.compile(r"^(?!/)(?!.*\.\.)[\w./-]+\.md$")    # meta.docs: a Markdown page, relative, inside the repo
SUITES_DIR = "expectations"   # where a suite named on the command line lives, from the working directory

SUITE_KEYS = ("name", "expectations", "table", "view", "params_section", "meta", "compute", "relations")
RELATION_KEYS = ("name", "sql", "materialize", "meta")
EXPECTATION_KEYS = ("type", "kwargs", "meta", "description")
# Kwargs that name the columns an expectation reads.
COLUMN_KEYS = ("column", "column_A", "column_B", "denominator_column")
COLUMN_LIST_KEYS = ("column_list",)
# Table-level checks that look at every column's name: unread columns still appear, as nulls.
ALL_NAMES_TYPES = ("expect_table_columns_to_match_set", "expect_table_columns_to_match_ordered_list",
                   "expect_table_column_count_to_equal", "expect_table_column_count_to_be_between")


class GateError(ValueError):
    """No verdict possible (exit 2): the message names the file, the field and the fix."""


@dataclass(frozen=True)
class ExpectationSpec:
    type: str
    kwargs: dict
    meta: dict = field(default_factory=dict)
    description: str | None = None


@dataclass(frozen=True)
class Relation:
    """A named relation the view reads, created in order before it. A view (the default) is
    recomputed wherever it is read, so its rows stream; `materialize` makes a table, computed once:
    for small aggregates over many rows that the view joins back. One SQL query that both
    aggregates its rows and joins the figures back holds every row until the aggregates are done
    (the tokens view held ~370 MB at 500K rows); split so, the rows stream twice instead."""
    name: str
    sql: str
    materialize: bool = False


@dataclass(frozen=True)
class Suite:
    name: str
    path: str
    sha256: str
    expectations: tuple[ExpectationSpec, ...]
    params_section: str
    table: str | None = None
    view: str | None = None
    meta: dict = field(default_factory=dict)
    compute: str | None = None      # the check whose tables the view reads; its gate stage passes it (compute.py)
    relations: tuple[Relation, ...] = ()


# ------------------------------------------------------------ suite

def parse_suite(doc: Any, path: str = "suite", sha256: str = "") -> Suite:
    if not isinstance(doc, dict):
        raise GateError(f"{path}: a suite is a JSON object {{\"name\": ..., \"expectations\": [...]}}, "
                        f"got {type(doc).__name__}")
    unknown = [k for k in doc if k not in SUITE_KEYS]
    if unknown:
        raise GateError(f"{path}: unknown key {unknown[0]!r}; allowed keys: {', '.join(SUITE_KEYS)}")
    name = doc.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise GateError(f"{path}: \"name\" must be an identifier (letters, digits, _), got {name!r}")
    items = doc.get("expectations")
    if not isinstance(items, list) or not items:
        raise GateError(f"{path}: \"expectations\" must be a non-empty list")
    specs = []
    for i, item in enumerate(items):
        where = f"{path}: expectations[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise GateError(f"{where}: each expectation is {{\"type\": \"expect_...\", \"kwargs\": {{...}}}}")
        bad = [k for k in item if k not in EXPECTATION_KEYS]
        if bad:
            raise GateError(f"{where}: unknown key {bad[0]!r}; allowed keys: {', '.join(EXPECTATION_KEYS)}")
        kwargs, meta = item.get("kwargs", {}), item.get("meta", {})
        if not isinstance(kwargs, dict) or not isinstance(meta, dict):
            raise GateError(f"{where}: \"kwargs\" and \"meta\" must be JSON objects")
        specs.append(ExpectationSpec(item["type"], kwargs, meta, item.get("description")))
    view = doc.get("view")
    if isinstance(view, list) and view and all(isinstance(line, str) for line in view):
        view = "\n".join(view)     # a long view reads better as one SQL line per JSON string
    for key, value in (("table", doc.get("table")), ("view", view), ("params_section", doc.get("params_section")),
                       ("compute", doc.get("compute"))):
        if value is not None and not isinstance(value, str):
            raise GateError(f"{path}: \"{key}\" must be a string (the view: or a list of lines), got {value!r}")
    if doc.get("compute") is not None and not view:
        raise GateError(f"{path}: \"compute\" needs a \"view\": the computed tables are relations the view reads")
    if not isinstance(doc.get("meta", {}), dict):
        raise GateError(f"{path}: \"meta\" must be a JSON object")
    docs = doc.get("meta", {}).get("docs")
    if docs is not None and not (isinstance(docs, str) and DOCS_RE.match(docs)):
        raise GateError(f"{path}: meta.docs {docs!r}: name the page that explains this gate as a path from the "
                        "repository root, e.g. \"docs/pipeline.md\"")
    relations = _relations(doc.get("relations", []), path)
    if relations and not view:
        raise GateError(f"{path}: \"relations\" needs a \"view\": they are relations the view reads")
    return Suite(name=name, path=path, sha256=sha256, expectations=tuple(specs),
                 params_section=doc.get("params_section") or name, table=doc.get("table"), view=view,
                 meta=doc.get("meta", {}), compute=doc.get("compute"), relations=relations)


def _relations(items: Any, path: str) -> tuple[Relation, ...]:
    if not isinstance(items, list):
        raise GateError(f"{path}: \"relations\" must be a list of {{\"name\", \"sql\", \"materialize\"}}")
    out = []
    for i, item in enumerate(items):
        where = f"{path}: relations[{i}]"
        if not isinstance(item, dict):
            raise GateError(f"{where}: must be an object with \"name\" and \"sql\"")
        bad = [k for k in item if k not in RELATION_KEYS]
        if bad:
            raise GateError(f"{where}: unknown key {bad[0]!r}; allowed keys: {', '.join(RELATION_KEYS)}")
        name, sql = item.get("name"), item.get("sql")
        if isinstance(sql, list) and sql and all(isinstance(line, str) for line in sql):
            sql = "\n".join(sql)
        if not isinstance(name, str) or not NAME_RE.match(name) or not isinstance(sql, str) or not sql.strip():
            raise GateError(f"{where}: needs a \"name\" (letters, digits, _) and its \"sql\" (a string or "
                            "a list of lines)")
        if not isinstance(item.get("materialize", False), bool):
            raise GateError(f"{where}: \"materialize\" must be true or false")
        out.append(Relation(name, sql, item.get("materialize", False)))
    return tuple(out)


def find_suite(ref: str, suites_dir: str | Path = SUITES_DIR) -> Path:
    """The suite file `ref` names: a path to a file, or a name (`tokens`: <suites_dir>/tokens.json)."""
    path = Path(ref)
    if path.is_file():
        return path
    named = Path(suites_dir) / f"{ref}.json"
    if NAME_RE.match(ref) and named.is_file():
        return named
    names = sorted(p.stem for p in Path(suites_dir).glob("*.json")) if Path(suites_dir).is_dir() else []
    available = ", ".join(names) if names else f"none ({suites_dir}/ holds no .json suite)"
    raise GateError(f"suite {ref!r}: neither a file nor a suite name in {suites_dir}/; available suites: "
                    f"{available} (pass one of these names, or the path of a suite file)")


def load_suite(path: str | Path) -> Suite:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GateError(f"{path}: suite not found; suites live in expectations/<name>.json") from None
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise GateError(f"{path}: not valid JSON ({e}); fix the file") from None
    return parse_suite(doc, str(path), hashlib.sha256(raw).hexdigest())


# ------------------------------------------------------------ $PARAMETER

def parameter_names(value: Any) -> list[str]:
    if isinstance(value, dict):
        if set(value) == {"$PARAMETER"}:
            return [value["$PARAMETER"]]
        return [n for v in value.values() for n in parameter_names(v)]
    if isinstance(value, list):
        return [n for v in value for n in parameter_names(v)]
    return []


def substitute(value: Any, values: dict) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$PARAMETER"}:
            return values[value["$PARAMETER"]]
        return {k: substitute(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, values) for v in value]
    return value


def resolve_parameters(suite: Suite, section: dict[str, Any] | None, where: str) -> tuple[Suite, dict]:
    """Replace every {"$PARAMETER": field}; return the suite and the fields used (for the result)."""
    wanted = [n for s in suite.expectations for n in parameter_names(s.kwargs)]
    if not wanted:
        return suite, {}
    if section is None:
        raise GateError(f"{suite.path}: uses $PARAMETER {wanted[0]!r} but {where} has no such section")
    for n in wanted:
        if n not in section:
            raise GateError(f"{suite.path}: unknown $PARAMETER {n!r}; {where} has: {', '.join(sorted(section))}")
    specs = tuple(replace(s, kwargs=substitute(s.kwargs, section)) for s in suite.expectations)
    return replace(suite, expectations=specs), {n: section[n] for n in sorted(set(wanted))}


def gate_section(params_path: str, section: str) -> tuple[dict | None, str]:
    from draftgate.config import ParamsError, as_dict, load_params

    try:
        params = load_params(params_path)
    except ParamsError as e:
        raise GateError(str(e)) from None
    gates = as_dict(params.gates)
    where = f"{params_path} gates.{section}"
    if section not in gates:
        raise GateError(f"{params_path}: no gates.{section} section for $PARAMETER; sections: "
                        f"{', '.join(gates)} (set \"params_section\" in the suite)")
    return gates[section], where


# ------------------------------------------------------------ columns

def columns_read(suite: Suite) -> tuple[set[str] | None, bool]:
    """(columns the suite reads, or None for all; whether every column's name must be present)."""
    cols: set[str] = set()
    for s in suite.expectations:
        kw = s.kwargs
        if kw.get("row_condition") is not None:
            return None, True  # a condition may read any column
        for k, v in kw.items():
            if k in COLUMN_KEYS and isinstance(v, str):
                cols.add(v)
            elif k in COLUMN_LIST_KEYS and isinstance(v, list):
                cols.update(c for c in v if isinstance(c, str))
            elif "column" in k and k not in ("column_set", "column_index") and k not in COLUMN_KEYS + COLUMN_LIST_KEYS:
                return None, True  # a column-naming kwarg we do not know: load everything
    return cols, any(s.type in ALL_NAMES_TYPES for s in suite.expectations)
