"""The Great Expectations side of a gate: context, suite, checkpoint, Data Docs.

Imported only when a gate runs (GX takes ~2-3 s to import). Every gate writes into ONE Data Docs
site: the site's index is rebuilt from the context's stores, so the expectation suites and
validation results are kept on disk beside the site (`<docs>/.gx/`), not in memory; an in-memory
store would make each gate wipe the pages of the gates before it.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import great_expectations as gx
import great_expectations.execution_engine.pandas_execution_engine as _gx_pandas_engine
import great_expectations.expectations.expectation as _gx_expectation
import great_expectations.util as _gx_util
from great_expectations.core.run_identifier import RunIdentifier
from great_expectations.data_context.types.base import DataContextConfig, ProgressBarsConfig
from great_expectations.expectations.registry import _registered_expectations

import draftgate.gx_custom  # noqa: F401  (registers the custom expectations)

SITE = "draftgate"

# Built-ins that misbehave with pandas 3 under GX 1.24 (FACTS.md): refused with the fix, never run.
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


# ------------------------------------------------------------ speed

def tune() -> None:
    """Three measured hot spots of GX 1.24 on pandas; each change leaves results unchanged.

    - GX md5-hashes every frame under 1 GB to fingerprint the batch (0.06-0.14 s per 100k rows);
      the gate already records the artifact's sha256, so the fingerprint is skipped.
    - Every mean/sum/stdev check scans the column in Python for decimal.Decimal objects
      (~6 ms per 100k rows, 56 ms per 1M); a numeric numpy dtype cannot hold one.
    - camel_to_snake (two regex passes) runs ~80 times per expectation per validation; it is a
      pure function of the class name, so it is memoised.
    """
    for module, name in ((_gx_pandas_engine, "HASH_THRESHOLD"), (_gx_util, "does_ndarray_contain_decimal_dtype"),
                         (_gx_expectation, "camel_to_snake")):
        if not hasattr(module, name):
            raise RuntimeError(f"GX internals changed ({module.__name__}.{name} is gone); "
                               "update draftgate.gx_run.tune for this GX version")
    _gx_pandas_engine.HASH_THRESHOLD = 0
    scan = _gx_util.does_ndarray_contain_decimal_dtype
    if not getattr(scan, "_draftgate", False):
        def numeric_skips_scan(data):
            return False if getattr(data, "dtype", None) is not None and data.dtype.kind in "iufb" else scan(data)
        numeric_skips_scan._draftgate = True
        _gx_util.does_ndarray_contain_decimal_dtype = numeric_skips_scan
    if not hasattr(_gx_expectation.camel_to_snake, "cache_info"):
        _gx_expectation.camel_to_snake = functools.cache(_gx_expectation.camel_to_snake)


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
    cls = _registered_expectations.get(type_name)
    if cls is None or getattr(cls, "is_abstract", lambda: False)():
        import difflib

        known = sorted(n for n, c in _registered_expectations.items() if not c.is_abstract())
        near = difflib.get_close_matches(type_name, known, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else "see the GX expectation gallery"
        raise SuiteError(f"unknown expectation type {type_name!r}; {hint}")
    return cls


def build_expectation(spec) -> Any:
    """One GX Expectation from a suite entry; pydantic checks the kwargs' names and types."""
    cls = expectation_class(spec.type)
    extra = {"meta": spec.meta} if spec.meta else {}
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

def validate(context, suite_name: str, expectations: list, frame, asset: str, docs: bool,
             result_format: dict, meta: dict | None = None) -> Run:
    """Validate `frame`; with `docs`, through a Checkpoint whose action updates the site.

    Without docs there is no action to run, so the ValidationDefinition runs on its own: the
    Checkpoint's freshness checks and serialisation cost ~0.05 s and do nothing else.
    """
    t0 = time.perf_counter()
    suite = context.suites.add_or_update(gx.ExpectationSuite(name=suite_name, expectations=expectations,
                                                             meta=meta or {}))
    batch = (context.data_sources.add_pandas("draftgate").add_dataframe_asset(asset)
             .add_batch_definition_whole_dataframe("whole"))
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=suite_name, data=batch, suite=suite))
    run_id = RunIdentifier(run_name=suite_name)
    page = None
    if docs:
        checkpoint = context.checkpoints.add(gx.Checkpoint(
            name=f"gate_{suite_name}", validation_definitions=[definition], result_format=result_format,
            actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=[SITE])]))
        t1 = time.perf_counter()
        (key, validation), = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=run_id).run_results.items()
        urls = context.get_docs_sites_urls(resource_identifier=key, site_name=SITE)
        page = urls[0]["site_url"] if urls else None
    else:
        t1 = time.perf_counter()
        validation = definition.run(batch_parameters={"dataframe": frame}, result_format=result_format, run_id=run_id)
    t2 = time.perf_counter()
    return Run(validation=validation, ids=[str(e.id) for e in suite.expectations], page=page,
               timings={"gx_setup_s": t1 - t0, "gx_run_s": t2 - t1})


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
