"""The Great Expectations side of a gate: context, suite, validation, Data Docs.

Imported only when a gate runs (GX takes ~2-3 s to import). Every gate writes into ONE Data Docs
site: the site's index is rebuilt from the context's stores, so the expectation suites and
validation results are kept on disk beside the site (`<docs>/.gx/`), not in memory; an in-memory
store would make each gate wipe the pages of the gates before it.

The validation itself is GX's: its Validator resolves every expectation's metrics in one
dependency graph on the pandas engine, the expectations judge them, and the result is GX's
ExpectationSuiteValidationResult, stored and rendered by GX's Data Docs site builder. What the gate
skips is GX's catalog around it (a registered ValidationDefinition and Checkpoint): see validate().
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
# GX's metric resolver opens a tqdm bar even with progress bars off, and tqdm's first bar imports
# multiprocessing for its lock: imported here with GX, not inside a gate's first validation
# (~4-9 ms of a fresh process's validation; an import moved, no work removed).
import multiprocessing.synchronize  # noqa: F401
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import great_expectations as gx
import great_expectations.execution_engine.pandas_execution_engine as _gx_pandas_engine
import great_expectations.expectations.expectation as _gx_expectation
import great_expectations.util as _gx_util
from great_expectations.constants import DATAFRAME_REPLACEMENT_STR
from great_expectations.core.expectation_validation_result import ExpectationSuiteValidationResult
from great_expectations.core.id_dict import IDDict
from great_expectations.core.run_identifier import RunIdentifier
from great_expectations.data_context.types.base import DataContextConfig, ProgressBarsConfig
from great_expectations.data_context.types.resource_identifiers import (
    ExpectationSuiteIdentifier,
    ValidationResultIdentifier,
)
from great_expectations.expectations.expectation_configuration import ExpectationConfiguration
from great_expectations.expectations.registry import _registered_expectations
from great_expectations.validator.validation_statistics import calc_validation_statistics
from great_expectations.validator.validator import Validator

import draftgate.gates.custom  # noqa: F401  (registers the custom expectations)

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
                               "update draftgate.gates.gx.tune for this GX version")
    _gx_pandas_engine.HASH_THRESHOLD = 0
    scan = _gx_util.does_ndarray_contain_decimal_dtype
    if not getattr(scan, "_draftgate", False):
        def numeric_skips_scan(data):
            return False if getattr(data, "dtype", None) is not None and data.dtype.kind in "iufb" else scan(data)
        numeric_skips_scan._draftgate = True
        _gx_util.does_ndarray_contain_decimal_dtype = numeric_skips_scan
    if not hasattr(_gx_expectation.camel_to_snake, "cache_info"):
        _gx_expectation.camel_to_snake = functools.cache(_gx_expectation.camel_to_snake)


# While GX's Validator builds and resolves a suite's metric graph (9 checks), it turns an
# expectation's configuration back into a new pydantic Expectation 72 times, re-derives an
# ExpectationConfiguration from an Expectation (a pydantic .dict() plus a new object) ~700 times,
# and fingerprints ~400 metric kwargs through a JSON converter that walks every None down a chain
# of numpy type checks. All three are pure functions of values that do not change during the graph
# walk, so for its duration only (fast_internals) the first two are memoised per object and the
# third skips the converter when the kwargs are already plain JSON. Measured on the bench suite
# (100k rows, 9 checks; main-thread CPU of a whole validate(), warm, min of 18): ~55 -> ~43 ms.
# test_gates.py checks each against GX's own version and the whole gate against GX's plain path.

def _plain_json(value: Any) -> bool:
    """Whether GX's convert_to_json_serializable would leave `value` as json.dumps writes it."""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:
        return True
    if kind is float:
        return value == value  # GX turns NaN into null, json.dumps writes NaN
    if kind is list or kind is tuple:
        return all(_plain_json(v) for v in value)
    if kind is dict:
        return all(type(k) is str and _plain_json(v) for k, v in value.items())
    return False


def _patchable() -> tuple[property, Any, Any]:
    configuration = _gx_expectation.Expectation.__dict__.get("configuration")
    to_domain_obj = ExpectationConfiguration.__dict__.get("to_domain_obj")
    to_id = IDDict.__dict__.get("to_id")
    if (not isinstance(configuration, property) or to_domain_obj is None or to_id is None
            or not hasattr(IDDict, "_id_ignore_keys")):
        raise RuntimeError("GX internals changed (Expectation.configuration, ExpectationConfiguration."
                           "to_domain_obj or IDDict.to_id); update draftgate.gates.gx.fast_internals for this GX version")
    return configuration, to_domain_obj, to_id


@contextlib.contextmanager
def fast_internals():
    """Memoised configurations, expectations and plain-JSON metric ids, inside this block only.

    Not for threads: another thread using GX meanwhile would see the memoised versions too.
    """
    plain_configuration, plain_to_domain_obj, plain_to_id = _patchable()
    built: dict[int, tuple] = {}   # id(object) -> (object kept alive, what it converts to)

    def memo(self, convert):
        hit = built.get(id(self))
        if hit is None:
            hit = built[id(self)] = (self, convert(self))
        return hit[1]

    def configuration(self):
        return memo(self, plain_configuration.fget)

    def to_domain_obj(self):
        return memo(self, plain_to_domain_obj)

    def to_id(self, id_keys=None, id_ignore_keys=None):
        # GX: md5 of json.dumps(convert_to_json_serializable(kwargs), sort_keys=True); one key
        # (or an ignore list) takes its other branches, so only the common case is shortcut.
        if (id_keys is None and id_ignore_keys is None and not self._id_ignore_keys and len(self) > 1
                and all(type(k) is str and _plain_json(v) for k, v in self.items())):
            text = json.dumps(self, sort_keys=True)
            return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()
        return plain_to_id(self, id_keys, id_ignore_keys)

    _gx_expectation.Expectation.configuration = property(configuration)
    ExpectationConfiguration.to_domain_obj = to_domain_obj
    IDDict.to_id = to_id
    try:
        yield
    finally:
        _gx_expectation.Expectation.configuration = plain_configuration
        ExpectationConfiguration.to_domain_obj = plain_to_domain_obj
        IDDict.to_id = plain_to_id


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
    context = gx.get_context(project_config=config, mode="ephemeral")
    # GX documents an ephemeral context as never saved, yet 1.24 renders its whole config to YAML
    # into an in-memory store on each of the 3 datasource/asset/batch-definition additions; nothing
    # reads that copy back. ~8 ms of CPU per gate (warm; more on a fresh process's first dumps).
    if context.mode != "ephemeral" or not hasattr(context, "_save_project_config"):
        raise RuntimeError("GX context changed (ephemeral mode, _save_project_config); "
                           "update draftgate.gates.gx.make_context for this GX version")
    context._save_project_config = lambda: None
    return context


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
    """Validate `frame` with GX's Validator; with `docs`, store the result and update the site.

    These are the steps of ValidationDefinition.run inside a Checkpoint with an
    UpdateDataDocsAction (one batch from a pandas dataframe asset, GX's Validator over the suite,
    the suite-level result, the results store, build_data_docs for that result and its suite)
    without GX's catalog around them: registering a definition and a checkpoint, their freshness
    diagnostics on every run (each re-serialises the suite and compares it with its stored copy),
    and storing the result where no site reads it. The catalog cost ~12 ms of CPU per gate on
    the bench suite (100k rows, 9 checks; the checks themselves ~25 ms). Nothing in the result or
    the Data Docs depends on it: test_gates.py compares both paths' results, and the rendered
    validation page is the same text (the stored result only lacks the ids of the definition and
    checkpoint, which lived in an in-memory store). All of it together, in a fresh process: the
    first validation took ~100-106 ms of CPU through the catalog and plain GX, ~62-64 ms here.
    """
    t0 = time.perf_counter()
    suite = gx.ExpectationSuite(name=suite_name, expectations=expectations, meta=meta or {})
    if docs:
        # The site renders the suite's own page from the store, which also assigns the ids.
        suite = context.suites.add_or_update(suite)
    else:
        for expectation in suite.expectations:
            expectation.id = str(uuid.uuid4())  # ids map GX's (reordered) results back to entries
    batch = (context.data_sources.add_pandas("draftgate").add_dataframe_asset(asset)
             .add_batch_definition_whole_dataframe("whole").get_batch(batch_parameters={"dataframe": frame}))
    validator = Validator(execution_engine=batch.data.execution_engine, data_context=context, batches=[batch])
    configurations = validator.process_expectations_for_validation(suite.expectation_configurations)
    run_id = RunIdentifier(run_name=suite_name)
    t1 = time.perf_counter()
    with fast_internals():
        results = validator.graph_validate(configurations=configurations,
                                           runtime_configuration={"result_format": dict(result_format)})
    stats = calc_validation_statistics(results)
    validation = ExpectationSuiteValidationResult(
        results=results, success=stats.success, suite_name=suite_name, batch_id=validator.active_batch_id,
        statistics={"evaluated_expectations": stats.evaluated_expectations,
                    "successful_expectations": stats.successful_expectations,
                    "unsuccessful_expectations": stats.unsuccessful_expectations,
                    "success_percent": stats.success_percent},
        meta={"great_expectations_version": gx.__version__,
              "batch_spec": _gx_util.convert_to_json_serializable(validator.active_batch_spec),
              "batch_markers": validator.active_batch_markers,
              "active_batch_definition": _gx_util.convert_to_json_serializable(validator.active_batch_definition),
              "run_id": run_id, "validation_time": run_id.run_time,
              "batch_parameters": {"dataframe": DATAFRAME_REPLACEMENT_STR}})
    t2, cpu2 = time.perf_counter(), time.process_time()
    page = None
    if docs:
        suite_key = ExpectationSuiteIdentifier(name=suite_name)
        key = ValidationResultIdentifier(expectation_suite_identifier=suite_key, run_id=run_id,
                                         batch_identifier=validator.active_batch_id)
        context.validation_results_store.store_validation_results(
            suite_validation_result=validation, suite_validation_result_identifier=key,
            expectation_suite_identifier=suite_key)
        context.build_data_docs(site_names=[SITE], resource_identifiers=[key, suite_key])
        urls = context.get_docs_sites_urls(resource_identifier=key, site_name=SITE)
        page = urls[0]["site_url"] if urls else None
    t3, cpu3 = time.perf_counter(), time.process_time()
    return Run(validation=validation, ids=[str(e.id) for e in suite.expectations], page=page,
               timings={"gx_setup_s": t1 - t0, "gx_run_s": t2 - t1, "gx_docs_s": t3 - t2, "gx_docs_cpu_s": cpu3 - cpu2})


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
