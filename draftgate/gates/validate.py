"""`draftgate validate`: a plain-JSON suite -> GX validation -> metric + result JSON + Data Docs.

    draftgate validate SUITE ARTIFACT [--input NAME=PATH ...] [--metric FILE] [--result FILE]
                       [--params params.yaml] [--docs reports/data_docs | --no-docs] [--keep-runs N]

SUITE is a name (`tokens` runs expectations/tokens.json) or the path of a suite file.

Exit 0 when every expectation passes; 1 when any fails (each failure printed on one line with
its observed value); 2 when there is no verdict: a missing or unreadable input, a bad suite, an
unknown $PARAMETER. The metric (numbers only: a DVC metric and a dep of the next stage) and the
result (everything the gate saw, for review) are written in all three cases and hold no
timestamps or timings, so an unchanged artifact gives byte-identical files.

The suite format is in suite.py. Only the columns the suite reads are loaded (table.py): a tokens
table's id lists are never materialised unless a check reads them. The table streams to GX in
batches of --batch-rows rows whose results merge into the whole table's (merge.py), so a gate's
memory does not grow with the table.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from draftgate.gates.compute import Check, run_check
from draftgate.gates.docs import KEEP_RUNS
from draftgate.gates import evidence
from draftgate.gates.merge import UNIQUE
from draftgate.gates.result import expectation_entry, failure_line, metric, short
from draftgate.gates.suite import (
    SUITES_DIR,
    GateError,
    Suite,
    columns_read,
    find_suite,
    gate_section,
    load_suite,
    parameter_names,
    resolve_parameters,
)
from draftgate.gates.table import BATCH_ROWS, Input, fingerprints, load_table, parse_input
from draftgate.io import write_json

RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": 5}


# ------------------------------------------------------------ the gate

@dataclass
class GateRun:
    result: dict
    timings: dict[str, float]
    page: str | None = None
    remote: list[str] = field(default_factory=list)   # remote asset references left in the Data Docs

    @property
    def success(self) -> bool:
        return bool(self.result["success"])


def run_gate(suite: Suite, inputs: list[Input], params_path: str = "params.yaml",
             docs: Path | None = None, keep_runs: int = KEEP_RUNS, batch_rows: int = BATCH_ROWS,
             checks: Mapping[str, Check] | None = None) -> GateRun:
    """Validate `suite` on `inputs`. `checks`: the functions a computing suite may name (its
    `"compute"`), handed over by its gate stage (compute.py); a SQL-only suite needs none."""
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
    computed = None
    if suite.compute:   # side tables from the raw artifacts (a forward pass, logits): compute.py
        computed, _ = run_check(suite.compute, checks or {}, {i.name: i.path for i in inputs}, params_path,
                                where=suite.path)
        timings["compute_s"] = lap("compute_cpu_s")
    wanted, all_names = columns_read(suite)
    loaded = load_table(inputs, table_key=suite.table, view=suite.view, wanted=wanted, all_names=all_names,
                        where=suite.path, computed=computed.tables if computed else None,
                        relations=suite.relations)
    timings["load_s"] = lap("load_cpu_s")
    try:
        bad = evidence.check(suite, loaded.columns)   # a suite's evidence naming no column: before any verdict
        if bad:
            raise GateError("; ".join(bad))
        hashing = fingerprints(loaded)
        from draftgate.gates import gx as gx_run  # Great Expectations itself: ~3 s

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
        # In batches (bounded memory) when every check's results merge from batches (merge.py); a
        # suite with one that does not is validated whole.
        size = batch_rows if gx_run.batchable(expectations) else None
        unique = tuple(dict.fromkeys(s.kwargs["column"] for s in suite.expectations
                                     if s.type == UNIQUE and isinstance(s.kwargs.get("column"), str)))
        run = gx_run.validate(gx_run.make_context(docs), suite.name, expectations, loaded.batches(size, unique),
                              asset=inputs[0].name, docs=docs, result_format=RESULT_FORMAT, meta=suite.meta,
                              keep=keep_runs, rows=lambda: loaded.batch_rows, duplicates=loaded.duplicates)
        # GX may reorder results; its ids map each back to the suite entry it came from.
        position = {ident: i for i, ident in enumerate(run.ids)}
        ranked = sorted(run.validation.results, key=lambda o: position[str(o.expectation_config.id)])
        specs = [suite.expectations[position[str(o.expectation_config.id)]] for o in ranked]
        entries = [expectation_entry(s, o) for s, o in zip(specs, ranked)]
        gx_total = lap("gx_cpu_s")
        # A failed check's first offending rows with their keys: one more pass over the table, on failure only.
        rows = evidence.offending_rows(loaded, {k: s for k, (s, e) in enumerate(zip(specs, entries))
                                                if evidence.wanted(s, e)})
        for k, found in rows.items():
            entries[k]["offending_rows"] = found
            entries[k]["offending_columns"] = list(found[0])   # their order on the page (the file sorts keys)
        timings["evidence_s"] = lap()
        loaded.close()   # the connection's memory, before the result is built
        timings.update(gx_setup_s=run.timings["gx_setup_s"], gx_run_s=run.timings["gx_run_s"],
                       batches=run.timings["batches"],
                       gx_s=gx_total - run.timings["gx_docs_s"],  # context, suite, validation: the verdict
                       docs_s=run.timings["gx_docs_s"])          # pruning, rebuilding the site, offline assets
        timings["gx_cpu_s"] -= run.timings["gx_docs_cpu_s"]
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
            "meta": suite.meta,     # why the gate exists and the docs page that explains it (its page links it)
        }
        if computed is not None:
            result["computed"] = {"producer": suite.compute, "report": computed.report}
        timings["result_s"] = lap()
        return GateRun(result=result, timings=timings, page=run.page, remote=run.remote)
    finally:
        loaded.close()   # its DuckDB connection and spill directory, whatever stopped the gate


# ------------------------------------------------------------ CLI

def parse_args(argv: list[str] | None, prog: str = "draftgate validate") -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=prog,
                                 description="Run a plain-JSON GX suite on an artifact; exit 1 when it fails.")
    ap.add_argument("suite", help="suite name (tokens: expectations/tokens.json, see --suites) or a suite file")
    ap.add_argument("artifact", help="PATH or NAME=PATH (.parquet, .jsonl, .json; a glob or directory of shards); "
                                     "its input name defaults to the suite name")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                    help="another named input for the suite's view (repeatable)")
    ap.add_argument("--metric", help="write the verdict and its figures here, numbers only (a DVC metric)")
    ap.add_argument("--result", help="write the full result here: every check with its kwargs, meta, observed "
                                     "value and unexpected sample, the view, the inputs' fingerprints")
    ap.add_argument("--suites", default=SUITES_DIR, help=f"where named suites live (default: {SUITES_DIR})")
    ap.add_argument("--params", default="params.yaml", help="params file for $PARAMETER (default: params.yaml)")
    ap.add_argument("--docs", default="reports/data_docs", help="Data Docs site shared by all gates")
    ap.add_argument("--no-docs", action="store_true", help="skip the Data Docs update")
    ap.add_argument("--keep-runs", type=int, default=KEEP_RUNS, metavar="N",
                    help=f"validation results kept per suite in the Data Docs, newest first (default: {KEEP_RUNS})")
    ap.add_argument("--batch-rows", type=int, default=BATCH_ROWS, metavar="N",
                    help=f"rows GX validates at a time; the results are merged (default: {BATCH_ROWS})")
    ap.add_argument("--timings", help="write the run's phase timings (seconds) here; kept out of --metric and --result, "
                                      "which must not change between runs on the same data")
    return ap.parse_args(argv)


def no_verdict(args: argparse.Namespace, message: str, prog: str, meta: dict | None = None) -> int:
    """`meta`: the suite's, where it loaded (its page still links the gate's docs)."""
    print(f"{prog}: {message}", file=sys.stderr)
    failed = {"suite_file": args.suite, "success": False, "error": message, **({"meta": meta} if meta else {})}
    if args.result:
        write_json(args.result, failed)
    if args.metric:
        write_json(args.metric, metric(failed))
    _page({**failed, "suite": Path(args.suite).stem,
           "artifact": {"path": args.artifact.partition("=")[2] if "=" in args.artifact else args.artifact}}, args)
    return 2


def _page(result: dict, args: argparse.Namespace) -> None:
    """The gate's own page (page.py), beside the Data Docs; its link printed last, where the reader's
    eye is when DVC stops."""
    if args.no_docs:
        return
    from draftgate.gates import page

    try:
        path = page.write(result, args.docs, record=args.result)
    except OSError as e:    # a page is for reading: its failure must not change the verdict
        print(f"  warning: could not write the gate's page: {e}", file=sys.stderr)
        return
    print(f"  {'why it failed' if not result.get('success') else 'page'}: {path.resolve().as_uri()}",
          file=sys.stderr if result.get("error") else sys.stdout)


def main(argv: list[str] | None = None, checks: Mapping[str, Check] | None = None,
         prog: str = "draftgate validate") -> int:
    """A gate: parse, validate, write the metric and the result, print; the exit code is the verdict.

    `draftgate validate` calls it with no checks (ad hoc, SQL-only suites); every gate stage of
    dvc.yaml calls it from stages/ (stages/gate.py, and stages/gate_<name>.py with its checks)."""
    args = parse_args(argv, prog)
    suite = None
    try:
        suite = load_suite(find_suite(args.suite, args.suites))
        inputs = [parse_input(args.artifact, suite.name)]
        for text in args.input:
            inp = parse_input(text, "")
            if not inp.name:
                raise GateError(f"--input {text!r}: expected NAME=PATH, e.g. --input rejects=data/prompts/rejects.parquet")
            inputs.append(inp)
        names = [i.name for i in inputs]
        if len(set(names)) != len(names):
            raise GateError(f"input names must differ, got {', '.join(names)}")
        if args.keep_runs < 1:
            raise GateError(f"--keep-runs {args.keep_runs}: keep at least 1 run (the one just made)")
        if args.batch_rows < 1:
            raise GateError(f"--batch-rows {args.batch_rows}: give a positive number of rows")
        run = run_gate(suite, inputs, params_path=args.params, docs=None if args.no_docs else Path(args.docs),
                       keep_runs=args.keep_runs, batch_rows=args.batch_rows, checks=checks)
    except GateError as e:
        return no_verdict(args, str(e), prog, suite.meta if suite else None)
    except Exception as e:  # a crash inside GX or DuckDB: still no verdict, never a silent pass
        import traceback

        traceback.print_exc()
        return no_verdict(args, f"internal error, please report: {type(e).__name__}: {e}", prog,
                          suite.meta if suite else None)
    if args.result:
        write_json(args.result, run.result)
    if args.metric:
        write_json(args.metric, metric(run.result))
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
            for row in e.get("offending_rows", []):
                print("      row: " + ", ".join(f"{k}={v!r}" for k, v in row.items()))
    for path in (args.metric, args.result):
        if path:
            print(f"  wrote {path}")
    if run.page:
        print(f"  data docs: {run.page}")
    for line in run.remote:
        print(f"  warning: a Data Docs page still loads from the network (new in GX's templates?): {line}",
              file=sys.stderr)
    _page(r, args)
    return 0 if run.success else 1
