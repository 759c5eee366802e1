"""`draftgate validate`: a plain-JSON suite -> GX validation -> result JSON + Data Docs.

    draftgate validate SUITE ARTIFACT [--input NAME=PATH ...] [--result FILE]
                       [--params params.yaml] [--docs reports/data_docs | --no-docs]

Exit 0 when every expectation passes; 1 when any fails (each failure printed on one line with
its observed value); 2 when there is no verdict: a missing or unreadable input, a bad suite, an
unknown $PARAMETER. The result file is written in all three cases and holds no timestamps or
timings, so an unchanged artifact gives a byte-identical file (it is a DVC metric and a dep of
the next stage).

Suite file (expectations/<name>.json):
    {"name": "tokens",                      # also the artifact's input name, unless NAME=PATH
     "params_section": "tokens",            # gates.<section> of params.yaml (default: name)
     "table": "checks",                     # JSON document artifact: validate the list under it
     "view": "SELECT ... FROM tokens",      # DuckDB SQL over the named inputs (or a list of lines)
     "expectations": [{"type": "expect_column_values_to_not_be_null",
                       "kwargs": {"column": "prompt_id"}, "meta": {...}}]}
A kwarg {"$PARAMETER": "field"} takes the value of gates.<section>.field; the suite GX runs (and
the Data Docs show) holds the resolved value.

Only the columns the suite reads are loaded (see gate_table.py): a tokens table's id lists are
never materialised unless a check reads them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from draftgate.gate_table import NAME_RE, GateError, Input, fingerprints, load_table, parse_input
from draftgate.io import write_json

SUITE_KEYS = ("name", "expectations", "table", "view", "params_section", "meta")
EXPECTATION_KEYS = ("type", "kwargs", "meta", "description")
# Kwargs that name the columns an expectation reads.
COLUMN_KEYS = ("column", "column_A", "column_B", "denominator_column")
COLUMN_LIST_KEYS = ("column_list",)
# Table-level checks that look at every column's name: unread columns still appear, as nulls.
ALL_NAMES_TYPES = ("expect_table_columns_to_match_set", "expect_table_columns_to_match_ordered_list",
                   "expect_table_column_count_to_equal", "expect_table_column_count_to_be_between")
RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": 5}
SAMPLE = 5          # unexpected values kept per expectation in the result file
SHORT = 200         # characters kept of any one value


@dataclass(frozen=True)
class ExpectationSpec:
    type: str
    kwargs: dict
    meta: dict = field(default_factory=dict)
    description: str | None = None


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
    for key, value in (("table", doc.get("table")), ("view", view), ("params_section", doc.get("params_section"))):
        if value is not None and not isinstance(value, str):
            raise GateError(f"{path}: \"{key}\" must be a string (the view: or a list of lines), got {value!r}")
    if not isinstance(doc.get("meta", {}), dict):
        raise GateError(f"{path}: \"meta\" must be a JSON object")
    return Suite(name=name, path=path, sha256=sha256, expectations=tuple(specs),
                 params_section=doc.get("params_section") or name, table=doc.get("table"), view=view,
                 meta=doc.get("meta", {}))


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


# ------------------------------------------------------------ result

def short(value: Any) -> Any:
    """JSON-safe, bounded copy of an observed value (no NaN: DVC reads these files)."""
    if isinstance(value, float):  # np.float64 too: it subclasses float
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value) <= SHORT else value[:SHORT] + f"... ({len(value)} chars)"
    if isinstance(value, (list, tuple)):
        return [short(v) for v in value[:SAMPLE]] + ([f"... ({len(value)} items)"] if len(value) > SAMPLE else [])
    if isinstance(value, dict):
        return {str(k): short(v) for k, v in list(value.items())[:20]}
    if value is None or isinstance(value, (bool, int)):
        return value
    if hasattr(value, "item"):  # numpy scalar
        return short(value.item())
    return short(str(value))


def expectation_entry(spec: ExpectationSpec, outcome: Any) -> dict:
    res = outcome.result or {}
    entry = {"type": spec.type, "kwargs": spec.kwargs, "success": bool(outcome.success)}
    if "observed_value" in res:
        entry["observed_value"] = short(res["observed_value"])
    if "unexpected_count" in res:
        entry["element_count"] = res.get("element_count")
        entry["unexpected_count"] = res["unexpected_count"]
        entry["unexpected_percent"] = short(res.get("unexpected_percent"))
        entry["unexpected_sample"] = short(list(res.get("partial_unexpected_list") or [])[:SAMPLE])
    errors = exception_messages(outcome.exception_info)
    if errors:
        entry["exception"] = "; ".join(errors)
    if spec.meta:
        entry["meta"] = spec.meta
    return entry


def exception_messages(info: Any) -> list[str]:
    """GX reports an error either flat or keyed by the metric that raised it (a missing column)."""
    if not isinstance(info, dict):
        return []
    found = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    messages = [" ".join(str(f.get("exception_message", "")).split()) for f in found if f.get("raised_exception")]
    return list(dict.fromkeys(m for m in messages if m))


def failure_line(i: int, e: dict) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in e["kwargs"].items())
    if e.get("exception"):
        what = f"error: {e['exception']}"
    elif "unexpected_count" in e and e.get("observed_value") is None:
        sample = ", ".join(repr(v) for v in e["unexpected_sample"])
        what = (f"{e['unexpected_count']} of {e['element_count']} rows unexpected "
                f"({(e['unexpected_percent'] or 0):.3g}%), e.g. {sample}")
    else:
        what = f"observed {e.get('observed_value')!r}"
    return f"  FAIL [{i}] {e['type']}({args}): {what}"


# ------------------------------------------------------------ the gate

@dataclass
class GateRun:
    result: dict
    timings: dict[str, float]
    page: str | None = None

    @property
    def success(self) -> bool:
        return bool(self.result["success"])


def run_gate(suite: Suite, inputs: list[Input], params_path: str = "params.yaml",
             docs: Path | None = None) -> GateRun:
    timings: dict[str, float] = {}
    clock = [(time.perf_counter(), time.process_time())]

    def lap(cpu_key: str | None = None) -> float:
        clock.append((time.perf_counter(), time.process_time()))
        (wall0, cpu0), (wall1, cpu1) = clock[-2:]
        if cpu_key:  # CPU of all the process's threads: steadier than wall time on a busy machine
            timings[cpu_key] = cpu1 - cpu0
        return wall1 - wall0

    import pandas, pyarrow.dataset  # noqa: E401,F401  (timed apart from the load itself)

    timings["imports_s"] = lap()
    section, where = (None, "")
    if any(parameter_names(s.kwargs) for s in suite.expectations):
        section, where = gate_section(params_path, suite.params_section)
    suite, used = resolve_parameters(suite, section, where)
    timings["params_s"] = lap()
    wanted, all_names = columns_read(suite)
    loaded = load_table(inputs, table_key=suite.table, view=suite.view, wanted=wanted, all_names=all_names,
                        where=suite.path)
    timings["load_s"] = lap("load_cpu_s")
    hashing = fingerprints(loaded)
    from draftgate import gx_run  # Great Expectations itself: ~2-3 s

    gx_run.tune()
    timings["gx_import_s"] = lap()
    # In a gate process the sha256 thread finished during the GX import; when GX was already
    # imported (another gate in this process) it is awaited here rather than left to contend with
    # the validation for the GIL.
    facts = [{**f, **h} for f, h in zip(loaded.inputs, hashing.result())]
    timings["fingerprint_wait_s"] = lap()
    try:
        expectations = [gx_run.build_expectation(s) for s in suite.expectations]
    except gx_run.SuiteError as e:
        raise GateError(f"{suite.path}: {e}") from None
    run = gx_run.validate(gx_run.make_context(docs), suite.name, expectations, loaded.frame, asset=inputs[0].name,
                          docs=docs is not None, result_format=RESULT_FORMAT, meta=suite.meta)
    gx_total = lap("gx_cpu_s")
    timings.update(gx_setup_s=run.timings["gx_setup_s"], gx_run_s=run.timings["gx_run_s"],
                   gx_s=gx_total - run.timings["gx_docs_s"],  # context, suite, validation: the verdict
                   docs_s=run.timings["gx_docs_s"])          # storing the result, rebuilding the site
    timings["gx_cpu_s"] -= run.timings["gx_docs_cpu_s"]
    # GX may reorder results; its ids map each back to the suite entry it came from.
    position = {ident: i for i, ident in enumerate(run.ids)}
    ranked = sorted(run.validation.results, key=lambda o: position[str(o.expectation_config.id)])
    entries = [expectation_entry(suite.expectations[position[str(o.expectation_config.id)]], o) for o in ranked]
    stats = run.validation.statistics
    result = {
        "suite": suite.name,
        "suite_file": suite.path,
        "suite_sha256": suite.sha256,
        "success": bool(run.validation.success),
        "statistics": {"evaluated": stats["evaluated_expectations"], "successful": stats["successful_expectations"],
                       "unsuccessful": stats["unsuccessful_expectations"],
                       "success_percent": short(stats["success_percent"])},
        "artifact": facts[0],
        "inputs": facts[1:],
        "table": suite.table,
        "view": suite.view,
        "rows": loaded.rows,
        "columns_loaded": loaded.loaded,
        "params": {"section": f"gates.{suite.params_section}", "values": used} if used else {},
        "expectations": entries,
        "docs": str(docs / "index.html") if docs else None,
    }
    timings["result_s"] = lap()
    return GateRun(result=result, timings=timings, page=run.page)


# ------------------------------------------------------------ CLI

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="draftgate validate",
                                 description="Run a plain-JSON GX suite on an artifact; exit 1 when it fails.")
    ap.add_argument("suite", help="suite file, e.g. expectations/tokens.json")
    ap.add_argument("artifact", help="PATH or NAME=PATH (.parquet, .jsonl, .json; a glob or directory of shards); "
                                     "its input name defaults to the suite name")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                    help="another named input for the suite's view (repeatable)")
    ap.add_argument("--result", help="write the result JSON here (a DVC metric)")
    ap.add_argument("--params", default="params.yaml", help="params file for $PARAMETER (default: params.yaml)")
    ap.add_argument("--docs", default="reports/data_docs", help="Data Docs site shared by all gates")
    ap.add_argument("--no-docs", action="store_true", help="skip the Data Docs update")
    ap.add_argument("--timings", help="write the run's phase timings (seconds) here; kept out of --result, "
                                      "which must not change between runs on the same data")
    return ap.parse_args(argv)


def no_verdict(args: argparse.Namespace, message: str) -> int:
    print(f"draftgate validate: {message}", file=sys.stderr)
    if args.result:
        write_json(args.result, {"suite_file": args.suite, "success": False, "error": message})
    return 2


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        suite = load_suite(args.suite)
        inputs = [parse_input(args.artifact, suite.name)]
        for text in args.input:
            inp = parse_input(text, "")
            if not inp.name:
                raise GateError(f"--input {text!r}: expected NAME=PATH, e.g. --input rejects=data/prompts/rejects.parquet")
            inputs.append(inp)
        names = [i.name for i in inputs]
        if len(set(names)) != len(names):
            raise GateError(f"input names must differ, got {', '.join(names)}")
        run = run_gate(suite, inputs, params_path=args.params, docs=None if args.no_docs else Path(args.docs))
    except GateError as e:
        return no_verdict(args, str(e))
    except Exception as e:  # a crash inside GX or DuckDB: still no verdict, never a silent pass
        import traceback

        traceback.print_exc()
        return no_verdict(args, f"internal error, please report: {type(e).__name__}: {e}")
    if args.result:
        write_json(args.result, run.result)
    if args.timings:
        write_json(args.timings, run.timings)
    r, t = run.result, run.timings
    stats = r["statistics"]
    verdict = (f"PASS {stats['successful']}/{stats['evaluated']} expectations" if run.success else
               f"FAIL {stats['unsuccessful']} of {stats['evaluated']} expectations failed")
    print(f"gate {r['suite']}: {verdict} on "
          f"{r['rows']:,} rows of {r['artifact']['path']} (load {t['load_s']:.2f} s, "
          f"GX import {t['gx_import_s']:.1f} s, GX {t['gx_s']:.2f} s, Data Docs {t['docs_s']:.2f} s)")
    for i, e in enumerate(r["expectations"]):
        if not e["success"]:
            print(failure_line(i, e))
    if args.result:
        print(f"  result: {args.result}")
    if run.page:
        print(f"  data docs: {run.page}")
    return 0 if run.success else 1
