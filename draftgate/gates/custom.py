"""Custom GX expectations for rules the built-ins cannot express.

Importing this module registers them with Great Expectations (GX registers every Expectation and
MetricProvider subclass when the class is created), so suites name them by snake_case type like
any built-in. Each one is a named subclass with typed parameters, a one-line docstring, and a
prescriptive renderer, so the Data Docs show a sentence with the resolved values rather than
`type(**kwargs)`. Only the pandas engine is implemented: gates validate pandas frames.

Rates over two tables (e.g. rejects / (prompts + rejects)) need no custom class: a suite `view`
computes the rate as a column over both inputs and a built-in checks its bounds.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, List, Optional, Tuple, Union

from great_expectations.compatibility import pydantic
from great_expectations.core.metric_domain_types import MetricDomainTypes
from great_expectations.execution_engine import PandasExecutionEngine
from great_expectations.expectations.expectation import (
    BatchExpectation,
    ColumnAggregateExpectation,
    ColumnMapExpectation,
)
from great_expectations.expectations.metrics.column_aggregate_metric_provider import (
    ColumnAggregateMetricProvider,
    column_aggregate_value,
)
from great_expectations.expectations.metrics.map_metric_provider import (
    ColumnMapMetricProvider,
    column_condition_partial,
)
from great_expectations.expectations.metrics.metric_provider import metric_value
from great_expectations.expectations.metrics.table_metric_provider import TableMetricProvider
from great_expectations.render import LegacyRendererType, RenderedStringTemplateContent
from great_expectations.render.renderer.renderer import renderer
from great_expectations.render.renderer_configuration import (
    RendererConfiguration,
    RendererValueType,
)

# The OpenAI chat roles a prompt may carry.
OPENAI_ROLES = ["system", "developer", "user", "assistant", "tool"]


def _bounds_text(min_value: Any, max_value: Any) -> str:
    if min_value is not None and max_value is not None:
        return "between $min_value and $max_value"
    if min_value is not None:
        return "at least $min_value"
    if max_value is not None:
        return "at most $max_value"
    return "any value"


def _sentence(template: str, params: dict) -> list:
    """One string-template block, the shape the HTML Data Docs renderer expects."""
    return [RenderedStringTemplateContent(
        content_block_type="string_template",
        string_template={"template": template, "params": params,
                         "styling": {"default": {"classes": ["badge", "badge-secondary"]}}},
    )]


def _kwargs(configuration: Any, result: Any) -> dict:
    """The kwargs a legacy renderer describes: from the configuration, else from the result."""
    cfg = configuration or (result.expectation_config if result else None)
    return dict(cfg.kwargs) if cfg else {}


def _described(rc: RendererConfiguration, params: tuple, template_str: str) -> RendererConfiguration:
    """Declare `params` ((name, RendererValueType or list of them), ...) and set the sentence."""
    for name, kind in params:
        rc.add_param(name=name, param_type=kind)
    rc.template_str = template_str
    return rc


def _between(value: Optional[float], bounds: Any) -> dict:
    """The verdict on a figure and the expectation's [min_value, max_value] (strict_*: exclusive).

    An undefined figure (an empty table, a zero denominator) fails, as GX's built-ins do.
    """
    if value is None or value != value:
        return {"success": False, "result": {"observed_value": None}}
    lo, hi = bounds.min_value, bounds.max_value
    above = lo is None or (value > lo if bounds.strict_min else value >= lo)
    below = hi is None or (value < hi if bounds.strict_max else value <= hi)
    return {"success": above and below, "result": {"observed_value": value}}


def _require_a_bound(values: dict) -> dict:
    lo, hi = values.get("min_value"), values.get("max_value")
    if lo is None and hi is None:
        raise ValueError("give min_value, max_value or both")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"min_value {lo} is greater than max_value {hi}")
    return values


# ------------------------------------------------------------ value fraction

class ColumnValueFraction(ColumnAggregateMetricProvider):
    metric_name = "column.value_fraction"
    value_keys = ("value",)
    # Nulls stay in the denominator: the fraction is over all rows of the table.
    filter_column_isnull = False

    @column_aggregate_value(engine=PandasExecutionEngine)
    def _pandas(cls, column, value, **kwargs):
        if len(column) == 0:
            return None  # undefined on an empty table; the expectation then fails
        hits = column.isin(value) if isinstance(value, list) else column == value
        return float(hits.sum()) / len(column)


Scalar = Union[pydantic.StrictBool, pydantic.StrictInt, pydantic.StrictFloat, pydantic.StrictStr]


class ExpectColumnValueFractionBetween(ColumnAggregateExpectation):
    """Expect the fraction of rows whose column equals `value` (or is in it, a list) to lie within [min_value, max_value]."""

    value: Union[Scalar, List[Scalar]]
    min_value: Optional[float] = None
    max_value: Optional[float] = None
    strict_min: bool = False
    strict_max: bool = False

    metric_dependencies: ClassVar[Tuple[str, ...]] = ("column.value_fraction",)
    success_keys: ClassVar[Tuple[str, ...]] = ("value", "min_value", "max_value", "strict_min", "strict_max")
    args_keys: ClassVar[Tuple[str, ...]] = ("column", "value", "min_value", "max_value")

    @pydantic.root_validator(skip_on_failure=True)
    def _check_bounds(cls, values):
        return _require_a_bound(values)

    @classmethod
    def _prescriptive_template(cls, renderer_configuration: RendererConfiguration) -> RendererConfiguration:
        kw = renderer_configuration.kwargs
        return _described(renderer_configuration, (
            ("column", RendererValueType.STRING),
            ("value", [RendererValueType.STRING, RendererValueType.NUMBER, RendererValueType.BOOLEAN,
                       RendererValueType.ARRAY]),
            ("min_value", RendererValueType.NUMBER), ("max_value", RendererValueType.NUMBER)),
            "fraction of rows where $column is $value must be "
            + _bounds_text(kw.get("min_value"), kw.get("max_value")) + ".")

    @classmethod
    @renderer(renderer_type=LegacyRendererType.PRESCRIPTIVE)
    def _prescriptive_renderer(cls, configuration=None, result=None, runtime_configuration=None, **kwargs):
        kw = _kwargs(configuration, result)
        if isinstance(kw.get("value"), list):
            kw["value"] = "one of " + ", ".join(map(str, kw["value"]))
        return _sentence("fraction of rows where $column is $value must be "
                         + _bounds_text(kw.get("min_value"), kw.get("max_value")) + ".", kw)

    def _validate(self, metrics: dict, runtime_configuration: Optional[dict] = None, execution_engine=None):
        return _between(metrics.get("column.value_fraction"), self)


# ------------------------------------------------------------ sum ratio of two columns

class TableColumnSums(TableMetricProvider):
    # The two sums, not their ratio: a gate validated in batches adds them up (merge.py).
    metric_name = "table.column_sums"
    value_keys = ("column", "denominator_column")

    @metric_value(engine=PandasExecutionEngine)
    def _pandas(cls, execution_engine, metric_domain_kwargs, metric_value_kwargs, metrics,
                runtime_configuration):
        df, _, _ = execution_engine.get_compute_domain(
            domain_kwargs=metric_domain_kwargs, domain_type=MetricDomainTypes.TABLE)
        num = df[metric_value_kwargs["column"]].sum()
        den = df[metric_value_kwargs["denominator_column"]].sum()
        return (num.item() if hasattr(num, "item") else num, den.item() if hasattr(den, "item") else den)


class ExpectColumnSumRatioBetween(BatchExpectation):
    """Expect sum(column) / sum(denominator_column) (|sum(column)| when absolute) to lie within [min_value, max_value]."""

    column: pydantic.StrictStr
    denominator_column: pydantic.StrictStr
    absolute: bool = False
    min_value: Optional[float] = None
    max_value: Optional[float] = None
    strict_min: bool = False
    strict_max: bool = False

    domain_keys: ClassVar[Tuple[str, ...]] = ("batch_id",)
    metric_dependencies: ClassVar[Tuple[str, ...]] = ("table.column_sums",)
    success_keys: ClassVar[Tuple[str, ...]] = (
        "column", "denominator_column", "absolute", "min_value", "max_value", "strict_min", "strict_max")
    args_keys: ClassVar[Tuple[str, ...]] = ("column", "denominator_column", "min_value", "max_value")

    @pydantic.root_validator(skip_on_failure=True)
    def _check_bounds(cls, values):
        return _require_a_bound(values)

    @classmethod
    def _prescriptive_template(cls, renderer_configuration: RendererConfiguration) -> RendererConfiguration:
        kw = renderer_configuration.kwargs
        return _described(renderer_configuration, (
            ("column", RendererValueType.STRING), ("denominator_column", RendererValueType.STRING),
            ("min_value", RendererValueType.NUMBER), ("max_value", RendererValueType.NUMBER)),
            "sum of $column over sum of $denominator_column must be "
            + _bounds_text(kw.get("min_value"), kw.get("max_value")) + ".")

    @classmethod
    @renderer(renderer_type=LegacyRendererType.PRESCRIPTIVE)
    def _prescriptive_renderer(cls, configuration=None, result=None, runtime_configuration=None, **kwargs):
        kw = _kwargs(configuration, result)
        num = "|sum of $column|" if kw.get("absolute") else "sum of $column"
        return _sentence(f"{num} over sum of $denominator_column must be "
                         + _bounds_text(kw.get("min_value"), kw.get("max_value")) + ".", kw)

    def _validate(self, metrics: dict, runtime_configuration: Optional[dict] = None, execution_engine=None):
        total, den = metrics.get("table.column_sums")
        num = abs(total) if self.absolute else total
        verdict = _between(None if den == 0 else float(num) / float(den), self)
        verdict["result"]["details"] = {"sum": total, "denominator_sum": den}   # signed: merge.py adds them
        return verdict


# ------------------------------------------------------------ chat roles in JSON messages

def roles_problem(text: Any, roles: list[str], last_roles: Optional[list[str]]) -> Optional[str]:
    """Why a messages value is invalid, or None. Pure, so the rule is testable without GX."""
    if not isinstance(text, str):
        return "not JSON text"
    try:
        messages = json.loads(text)
    except ValueError:
        return "not valid JSON"
    if not isinstance(messages, list) or not messages:
        return "not a non-empty JSON list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in roles:
            return f"message {i} has role {m.get('role') if isinstance(m, dict) else None!r}"
    if last_roles is not None and messages[-1]["role"] not in last_roles:
        return f"last message has role {messages[-1]['role']!r}"
    return None


class ColumnValuesJsonRolesValid(ColumnMapMetricProvider):
    condition_metric_name = "column_values.json_roles_valid"
    condition_value_keys = ("roles", "last_roles")

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, roles, last_roles, **kwargs):
        return column.map(lambda v: roles_problem(v, roles, last_roles) is None).astype(bool)


class ExpectColumnValuesJsonRolesValid(ColumnMapExpectation):
    """Expect each value to be a JSON list of messages whose roles are in `roles` (the last one in `last_roles`)."""

    roles: List[str] = pydantic.Field(default_factory=lambda: list(OPENAI_ROLES))
    last_roles: Optional[List[str]] = None

    map_metric: ClassVar[str] = "column_values.json_roles_valid"
    success_keys: ClassVar[Tuple[str, ...]] = ("roles", "last_roles", "mostly")
    args_keys: ClassVar[Tuple[str, ...]] = ("column", "roles", "last_roles")

    @classmethod
    def _prescriptive_template(cls, renderer_configuration: RendererConfiguration) -> RendererConfiguration:
        return _described(renderer_configuration, (("column", RendererValueType.STRING),),
                          "$column values must be JSON message lists with known roles.")

    @classmethod
    @renderer(renderer_type=LegacyRendererType.PRESCRIPTIVE)
    def _prescriptive_renderer(cls, configuration=None, result=None, runtime_configuration=None, **kwargs):
        kw = _kwargs(configuration, result)
        kw.setdefault("roles", list(OPENAI_ROLES))
        text = "$column values must be JSON lists of messages with role in $roles"
        if kw.get("last_roles"):
            text += ", the last one in $last_roles"
        return _sentence(text + ".", {k: (", ".join(v) if isinstance(v, list) else v) for k, v in kw.items()})


# ------------------------------------------------------------ not in a set, ignoring case

class ColumnValuesNotInSetIgnoringCase(ColumnMapMetricProvider):
    condition_metric_name = "column_values.not_in_set_ignoring_case"
    condition_value_keys = ("value_set",)

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, value_set, **kwargs):
        banned = {str(v).casefold() for v in value_set}
        return ~column.astype(str).str.casefold().isin(banned)


class ExpectColumnValuesToNotBeInSetIgnoringCase(ColumnMapExpectation):
    """Expect no value to equal a member of `value_set` when both are case-folded (Fireworks = fireworks)."""

    value_set: List[str]

    map_metric: ClassVar[str] = "column_values.not_in_set_ignoring_case"
    success_keys: ClassVar[Tuple[str, ...]] = ("value_set", "mostly")
    args_keys: ClassVar[Tuple[str, ...]] = ("column", "value_set")

    @classmethod
    def _prescriptive_template(cls, renderer_configuration: RendererConfiguration) -> RendererConfiguration:
        return _described(renderer_configuration, (("column", RendererValueType.STRING),
                                                   ("value_set", RendererValueType.ARRAY)),
                          "$column values must not be any of $value_set, ignoring case.")

    @classmethod
    @renderer(renderer_type=LegacyRendererType.PRESCRIPTIVE)
    def _prescriptive_renderer(cls, configuration=None, result=None, runtime_configuration=None, **kwargs):
        kw = _kwargs(configuration, result)
        kw["value_set"] = ", ".join(map(str, kw.get("value_set") or [])) or "(none)"
        return _sentence("$column values must not be any of $value_set, ignoring case.", kw)


CUSTOM_TYPES = (
    "expect_column_value_fraction_between",
    "expect_column_sum_ratio_between",
    "expect_column_values_json_roles_valid",
    "expect_column_values_to_not_be_in_set_ignoring_case",
)
