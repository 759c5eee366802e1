"""The Data Docs site rebuilt from the gates' records, so every gate with a result has its page.

Each gate stage writes its full result, data/gates/<suite>.details.json (validate.py), a DVC output
committed with the pipeline, and also updates the shared site as it runs. A gate that DVC found up
to date never ran in this checkout, so the site a gate run leaves behind lists only the gates that
reran (in a fresh clone after `make repro`: 4 of 8). The report stage therefore rebuilds the site
from the records: one validation per gate, holding exactly what its record holds (verdict, each
check with its kwargs, notes, observed value and unexpected sample), rendered by GX's own site
builder and made offline by docs.localise. The report's gate table reads the same records, so the
two agree on the gates, their verdicts and their times.

Each validation page also explains every check under its row: its note (meta.notes: what it
recomputes and why it matters; GX 1.24 renders notes on the suite page only) and, for a failed
check, its first offending rows with their keys and the evidence its suite computed (evidence.py),
written into the page GX rendered by docs.explain.

The records hold no timestamp (a result is byte-identical for unchanged inputs); the time shown is
when the record was made: its commit's time when the file is as committed, else the file's mtime
(a gate that ran in this workspace). The run name says which: the commit, or "workspace".
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Record:
    gate: str                # the DVC stage (gate_tokens)
    path: Path               # its data/gates/<suite>.details.json
    result: dict
    run_name: str            # the commit the record is from (8 hex), or "workspace"
    run_time: dt.datetime    # UTC

    @property
    def suite(self) -> str:
        return str(self.result.get("suite") or Path(self.result.get("suite_file") or self.gate).stem)


def read_records(root: Path, gates: dict[str, str]) -> list[Record]:
    """`gates`: {stage name: details path relative to root}; a record missing on disk is left out."""
    out = []
    for gate, rel in gates.items():
        path = root / rel
        if not path.is_file():
            continue
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if isinstance(result, dict):
            name, time = recorded(root, rel, path)
            out.append(Record(gate, path, result, name, time))
    return out


def recorded(root: Path, rel: str, path: Path) -> tuple[str, dt.datetime]:
    """(commit or "workspace", time) of the record: the last commit that wrote the file when the
    workspace holds it unchanged, else the file's own mtime."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    if not git("status", "--porcelain", "--", rel):
        line = git("log", "-1", "--format=%h %ct", "--abbrev=8", "--", rel)
        if line:
            commit, seconds = line.split()
            return commit, dt.datetime.fromtimestamp(int(seconds), dt.timezone.utc)
    return "workspace", dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)


def rebuild(site: Path, records: list[Record]) -> dict[str, str]:
    """Replace `site` with the Data Docs of `records`; returns {gate: its page, relative to site}.

    GX is imported here (~3 s): only the report stage calls this."""
    import great_expectations as gx
    from great_expectations.core import ExpectationSuiteValidationResult, ExpectationValidationResult
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    from draftgate.gates import docs
    from draftgate.gates import gx as gx_run
    from draftgate.gates.suite import ExpectationSpec

    site = Path(site)
    if site.exists():    # what the gates' runs left: pages of the gates that reran, older runs
        shutil.rmtree(site)
    context = gx_run.make_context(site)
    store = context.validation_results_store
    keys, pages, shown = [], {}, {}
    for rec in records:
        r = rec.result
        entries = [e for e in r.get("expectations") or [] if isinstance(e, dict) and e.get("type")]
        expectations = []
        for e in entries:
            try:
                expectations.append(gx_run.build_expectation(
                    ExpectationSpec(e["type"], dict(e.get("kwargs") or {}), dict(e.get("meta") or {}))))
            except gx_run.SuiteError:
                expectations.append(None)    # a type this GX does not know: the check is left off the page
        meta = {"record": str(rec.path.name), "gate": rec.gate}
        if r.get("error"):
            meta["no_verdict"] = r["error"]
        suite = context.suites.add(gx.ExpectationSuite(name=rec.suite, meta=meta,
                                                       expectations=[x for x in expectations if x is not None]))
        configs = iter(suite.expectations)
        results = [_outcome(e, next(configs).configuration, ExpectationValidationResult)
                   for e, x in zip(entries, expectations) if x is not None]
        stats = r.get("statistics") or {}
        run_id = RunIdentifier(run_name=rec.run_name, run_time=rec.run_time)
        validation = ExpectationSuiteValidationResult(
            success=bool(r.get("success")), results=results, suite_name=rec.suite,
            statistics={"evaluated_expectations": stats.get("evaluated", len(results)),
                        "successful_expectations": stats.get("successful", sum(bool(o.success) for o in results)),
                        "unsuccessful_expectations": stats.get("unsuccessful", sum(not o.success for o in results)),
                        "success_percent": stats.get("success_percent")},
            meta={"run_id": run_id, "great_expectations_version": gx.__version__,
                  "active_batch_definition": {"datasource_name": "draftgate", "data_asset_name": rec.suite,
                                              "batch_definition_name": "record"},
                  "batch_markers": {"record": str(rec.path.name), "gate": rec.gate, "rows": r.get("rows"),
                                    "artifact": (r.get("artifact") or {}).get("path"),
                                    "artifact_sha256": (r.get("artifact") or {}).get("sha256")}})
        key = ValidationResultIdentifier(expectation_suite_identifier=ExpectationSuiteIdentifier(name=rec.suite),
                                         run_id=run_id, batch_identifier=rec.gate)
        store.set(key, validation)
        keys.append(key)
        *folders, name = key.to_tuple()
        pages[rec.gate] = "/".join(("validations", *folders, f"{name}.html"))
        shown[rec.gate] = [((e.get("kwargs") or {}).get("column"), (e.get("meta") or {}).get("notes"),
                            e.get("offending_rows") or [], e.get("offending_columns") or [])
                           for e, x in zip(entries, expectations) if x is not None]
    context.build_data_docs(site_names=[gx_run.SITE])
    for gate, rel in pages.items():    # each check's note and evidence on the page (docs.explain)
        page = site / rel
        if page.is_file():
            page.write_text(docs.explain(page.read_text(encoding="utf-8"), shown[gate]), encoding="utf-8")
    docs.localise(site)
    return pages


def _text(v):
    return v if v is None or isinstance(v, str) else json.dumps(v)


def _outcome(entry: dict, config, cls):
    """A GX result from one record entry: the figures GX's renderers read, as the gate saw them."""
    result = {}
    if "observed_value" in entry:
        result["observed_value"] = entry["observed_value"]
    if "unexpected_count" in entry:
        sample = [v for v in entry.get("unexpected_sample") or [] if not (isinstance(v, str) and v.startswith("... ("))]
        result.update(element_count=entry.get("element_count"), unexpected_count=entry["unexpected_count"],
                      unexpected_percent=entry.get("unexpected_percent"), partial_unexpected_list=sample)
    column = (entry.get("kwargs") or {}).get("column")
    rows = [r for r in entry.get("offending_rows") or [] if isinstance(r, dict) and column in r]
    if rows:    # GX's table of unexpected values and their counts; the rows: docs.explain
        import collections

        counts = collections.Counter(_text(r[column]) for r in rows)
        result.update(partial_unexpected_counts=[{"value": v, "count": c} for v, c in counts.items()])
    info = {"raised_exception": bool(entry.get("exception")), "exception_message": entry.get("exception"),
            "exception_traceback": None}
    return cls(success=bool(entry.get("success")), expectation_config=config, result=result, exception_info=info)
