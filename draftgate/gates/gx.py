"""The Great Expectations side of a gate, through GX's public API: context, validation, Data Docs.

Imported only when a gate runs (GX takes ~3 s to import). A gate follows GX's documented path:
an ExpectationSuite, a pandas dataframe asset with a whole-frame batch definition, a
ValidationDefinition run on the frame (which stores its result), then build_data_docs for that
result and its suite. Nothing of GX is patched, stubbed or reached through a private name:
tests/test_gates_gx.py scans this package for all three.

Every gate writes into ONE Data Docs site. The site's index is rebuilt from the context's stores, so
the suites and validation results live on disk beside the site (`<docs>/.gx/`); an in-memory store
would make each gate wipe the pages of the gates before it. Only the last `keep` results of each
suite stay (prune), so `.gx/validations` and the site stop growing with every run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import great_expectations as gx
import great_expectations.exceptions as gx_exceptions
from great_expectations.data_context.types.base import DataContextConfig, ProgressBarsConfig
from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier
from great_expectations.expectations.expectation import (
    ColumnMapExpectation,
    ColumnPairMapExpectation,
    MulticolumnMapExpectation,
)
from great_expectations.expectations.registry import (
    get_expectation_impl,
    list_registered_expectation_implementations,
)

import draftgate.gates.custom  # noqa: F401  (registers the custom expectations)
from draftgate.gates import docs as site_docs
from draftgate.gates import merge

SITE = "draftgate"

# Built-ins that misbehave with pandas 3 under GX 1.24 (docs/great-expectations.md): refused with the fix.
BROKEN = {
    "expect_column_values_to_be_in_type_list":
        "always fails with pandas 3 in GX 1.24; use expect_column_values_to_be_of_type "
        "(type_ 'str' for text, 'int64', 'float64', 'bool')",
    "expect_column_quantile_values_to_be_between":
        "crashes when GX saves its result (numpy bool in the result); use "
        "expect_column_median_to_be_between, or a view that computes quantile_cont() as a column",
}


class SuiteError(ValueError):
    """A suite GX cannot build: unknown type, bad kwargs, a known-broken built-in."""


@dataclass(frozen=True)
class Run:
    validation: Any          # ExpectationSuiteValidationResult
    ids: list[str]           # the suite's expectation ids, in suite order
    page: str | None         # the validation's Data Docs page, when docs were built
    timings: dict[str, float]
    remote: list[str]        # remote asset references left in the site (none unless GX's templates changed)


# ------------------------------------------------------------ context

def make_context(docs: Path | None):
    """Ephemeral context; with `docs`, suites/results persist under docs/.gx and a site at docs."""
    memory = {"class_name": "InMemoryStoreBackend"}
    docs = docs.resolve() if docs else None  # GX's filesystem stores want absolute paths

    def on_disk(sub: str) -> dict:
        return {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs / ".gx" / sub)}

    stores = {
        "expectations_store": {"class_name": "ExpectationsStore",
                               "store_backend": on_disk("expectations") if docs else memory},
        "validation_results_store": {"class_name": "ValidationResultsStore",
                                     "store_backend": on_disk("validations") if docs else memory},
        "checkpoint_store": {"class_name": "CheckpointStore", "store_backend": memory},
        "validation_definition_store": {"class_name": "ValidationDefinitionStore", "store_backend": memory},
    }
    sites = {}
    if docs:
        sites[SITE] = {
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder", "show_cta_footer": False},
        }
    config = DataContextConfig(
        stores=stores,
        expectations_store_name="expectations_store",
        validation_results_store_name="validation_results_store",
        checkpoint_store_name="checkpoint_store",
        data_docs_sites=sites,
        # Offline machines: no usage statistics, no progress bars in DVC logs.
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
    )
    return gx.get_context(project_config=config, mode="ephemeral")


# ------------------------------------------------------------ suite

def expectation_class(type_name: str):
    if type_name in BROKEN:
        raise SuiteError(f"{type_name} {BROKEN[type_name]}")
    try:
        cls = get_expectation_impl(type_name)
    except gx_exceptions.ExpectationNotFoundError:
        cls = None
    if cls is None or cls.is_abstract():
        import difflib

        known = sorted(n for n in list_registered_expectation_implementations()
                       if not get_expectation_impl(n).is_abstract())
        near = difflib.get_close_matches(type_name, known, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else "see the GX expectation gallery"
        raise SuiteError(f"unknown expectation type {type_name!r}; {hint}")
    return cls


def build_expectation(spec) -> Any:
    """One GX Expectation from a suite entry; pydantic checks the kwargs' names and types."""
    cls = expectation_class(spec.type)
    extra = {"meta": spec.meta} if spec.meta else {}
    # GX 1.24's Data Docs render an expectation's own `notes` field (markdown) on the suite page;
    # they no longer read meta.notes. A list renders plain, a bare string in red, as if an error.
    notes = spec.meta.get("notes")
    if notes:
        extra["notes"] = [notes] if isinstance(notes, str) else list(notes)
    if spec.description:
        extra["description"] = spec.description
    try:
        return cls(**spec.kwargs, **extra)
    except Exception as e:  # pydantic ValidationError or GX InvalidExpectationConfigurationError
        allowed = ", ".join(n for n in cls.__fields__ if n not in ("id", "meta", "notes", "rendered_content",
                                                                     "batch_id", "result_format", "severity",
                                                                     "windows", "catch_exceptions"))
        raise SuiteError(f"{spec.type}: bad kwargs {spec.kwargs}: {_one_line(e)}; its kwargs are: {allowed}") from None


# ------------------------------------------------------------ run

def batchable(expectations: list) -> bool:
    """Whether every expectation's results merge from batches (merge.py); else the table is
    validated whole, in one frame, as GX's documented path does."""
    row_level = (ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)
    return all(merge.batchable(e.expectation_type, isinstance(e, row_level)) for e in expectations)


def validate(context, suite_name: str, expectations: list, frames: Iterable, asset: str, docs: Path | None,
             result_format: dict, meta: dict | None = None, keep: int = site_docs.KEEP_RUNS,
             rows: Callable[[], list[int]] | None = None, duplicates: Callable[[str, int], Any] | None = None) -> Run:
    """Validate the table (`frames`: its batches, in order) against the suite; with `docs`, prune
    old results and update the site.

    One frame: GX's result as it is. More: GX validates each batch and merge.py makes the whole
    table's result of theirs (`rows()`: the batches' row counts; `duplicates(column, n)`: a
    uniqueness count over the whole table); with docs, only that result stays in the store.
    """
    t0 = time.perf_counter()
    suite = gx.ExpectationSuite(name=suite_name, expectations=expectations, meta=meta or {})
    # The store assigns the expectations' ids, which map GX's (reordered) results back to entries.
    suite = context.suites.add_or_update(suite) if docs else context.suites.add(suite)
    batch = (context.data_sources.add_pandas("draftgate").add_dataframe_asset(asset)
             .add_batch_definition_whole_dataframe("whole"))
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=suite_name, data=batch,
                                                                            suite=suite))
    t1 = time.perf_counter()
    runs = [definition.run(batch_parameters={"dataframe": frame}, result_format=dict(result_format))
            for frame in frames]
    validation = runs[-1]
    if len(runs) > 1:
        merged(runs, rows() if rows else [], result_format, duplicates)
        if docs:   # each batch's run stored its result: keep one key, holding the merged result
            store = context.validation_results_store
            ids = {r.meta["run_id"].to_tuple() for r in runs}
            last = validation.meta["run_id"].to_tuple()
            for key in store.list_keys():
                if key.expectation_suite_identifier.name == suite_name and key.run_id.to_tuple() in ids:
                    if key.run_id.to_tuple() == last:
                        store.set(key, validation)
                    else:
                        store.remove_key(key)
    t2, cpu2 = time.perf_counter(), time.process_time()
    page, remote = None, []
    if docs:
        kept = prune(context, docs, suite_name, keep)
        key = next(k for k in kept if k.run_id.to_tuple() == validation.meta["run_id"].to_tuple())
        context.build_data_docs(site_names=[SITE], resource_identifiers=[key, ExpectationSuiteIdentifier(name=suite_name)])
        remote = site_docs.localise(docs)
        urls = context.get_docs_sites_urls(resource_identifier=key, site_name=SITE)
        page = urls[0]["site_url"] if urls else None
    t3, cpu3 = time.perf_counter(), time.process_time()
    return Run(validation=validation, ids=[str(e.id) for e in suite.expectations], page=page, remote=remote,
               timings={"gx_setup_s": t1 - t0, "gx_run_s": t2 - t1, "gx_docs_s": t3 - t2, "gx_docs_cpu_s": cpu3 - cpu2,
                        "batches": len(runs)})


def merged(runs: list, rows: list[int], result_format: dict, duplicates: Callable[[str, int], Any] | None) -> None:
    """Make the last run's result the whole table's (merge.py), in place: each expectation's
    success and result, and the suite's success and statistics."""
    partial = result_format.get("partial_unexpected_count", 20)
    by_id = [{str(o.expectation_config.id): o for o in r.results} for r in runs]
    final = runs[-1]
    for outcome in final.results:
        ident = str(outcome.expectation_config.id)
        parts = [b[ident] for b in by_id]
        if any(_raised(p.exception_info) for p in parts):
            failed = next(p for p in parts if _raised(p.exception_info))
            outcome.success, outcome.result, outcome.exception_info = False, failed.result, failed.exception_info
            continue
        cfg = outcome.expectation_config
        kwargs = dict(cfg.kwargs)
        dup = duplicates(kwargs["column"], partial) if cfg.type == merge.UNIQUE and duplicates else None
        outcome.success, outcome.result = merge.merge(cfg.type, kwargs, [dict(p.result) for p in parts],
                                                      [bool(p.success) for p in parts], rows, partial, dup)
    good = sum(bool(o.success) for o in final.results)
    total = len(final.results)
    final.success = good == total
    final.statistics = {**final.statistics, "evaluated_expectations": total, "successful_expectations": good,
                        "unsuccessful_expectations": total - good,
                        "success_percent": good / total * 100 if total else None}


def _raised(info: Any) -> bool:
    if not isinstance(info, dict):
        return False
    found = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    return any(f.get("raised_exception") for f in found)


def prune(context, docs: Path, suite_name: str, keep: int) -> list:
    """Drop all but the newest `keep` stored results of the suite, and their pages; return the kept keys.

    The site's index lists what the results store holds, so a pruned result leaves the index at the
    next build; its page is deleted here (the site mirrors each result key as a path).
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (the run just made), got {keep}")
    store = context.validation_results_store
    keys = sorted((k for k in store.list_keys() if k.expectation_suite_identifier.name == suite_name),
                  key=lambda k: k.run_id.run_time)
    pages = Path(docs, "validations")
    for key in keys[:-keep]:
        store.remove_key(key)     # the store also removes the folders it leaves empty
        *folders, name = key.to_tuple()
        page = pages.joinpath(*folders, f"{name}.html")
        page.unlink(missing_ok=True)
        for folder in page.parents:
            if folder == pages or not folder.is_dir() or any(folder.iterdir()):
                break
            folder.rmdir()
    return keys[-keep:]


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
