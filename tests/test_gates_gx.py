"""The GX runner: GX's public API only, results mapped back to the suite's entries."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftgate.gates.suite import ExpectationSpec, Suite
from draftgate.gates.table import Input

PACKAGE = Path(__file__).resolve().parents[1] / "draftgate" / "gates"


# ------------------------------------------------------------ public API only

def gx_problems(path: Path) -> list[str]:
    """Private GX names, and assignments into anything imported (a patch), in one module."""
    tree = ast.parse(path.read_text(), str(path))
    imported: set[str] = set()
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            for alias in node.names:
                full = f"{module}.{alias.name}" if module else alias.name
                if full.startswith("great_expectations") and any(p.startswith("_") for p in full.split(".")):
                    problems.append(f"{path.name}:{node.lineno}: imports private {full}")
                imported.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            problems.append(f"{path.name}:{node.lineno}: reaches private attribute .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            problems.append(f"{path.name}:{node.lineno}: setattr")
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            root = target
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if root is not target and isinstance(root, ast.Name) and root.id in imported:
                problems.append(f"{path.name}:{node.lineno}: assigns into imported {ast.unparse(target)}")
    return problems


def test_the_gates_package_uses_gx_only_through_its_public_api():
    modules = sorted(PACKAGE.glob("*.py"))
    assert {m.name for m in modules} >= {"gx.py", "custom.py", "validate.py"}
    assert [p for m in modules for p in gx_problems(m)] == []


def test_the_scan_catches_the_patches_the_runner_used_to_make(tmp_path):
    old = tmp_path / "old.py"
    old.write_text("import great_expectations.util as _gx_util\n"
                   "from great_expectations.expectations.registry import _registered_expectations\n"
                   "from great_expectations.core.id_dict import IDDict\n"
                   "_gx_util.does_ndarray_contain_decimal_dtype = lambda data: False\n"
                   "IDDict.to_id = lambda self: ''\n"
                   "def make(context):\n"
                   "    context._save_project_config = lambda: None\n")
    found = gx_problems(old)
    assert len(found) == 4, found
    assert any("private great_expectations.expectations.registry._registered_expectations" in p for p in found)
    assert any("_gx_util.does_ndarray_contain_decimal_dtype" in p for p in found)
    assert any("IDDict.to_id" in p for p in found)
    assert any("._save_project_config" in p for p in found)


# What GX rebinds itself while it runs: DataContextConfig caches a new marshmallow schema per config.
GX_OWN_CACHES = {("great_expectations.data_context.types.base", "DataContextConfig", "schema_instance")}


def gx_attributes() -> dict:
    """Every GX module's and class's attributes, by identity: a patch changes one."""
    seen = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("great_expectations") and module is not None:
            for attr, value in list(vars(module).items()):
                seen[(name, attr)] = id(value)
                if isinstance(value, type) and value.__module__ == name:
                    for member, inner in list(vars(value).items()):
                        seen[(name, attr, member)] = id(inner)
    return seen


def test_a_gate_run_leaves_every_gx_module_and_class_as_it_found_them(tmp_path):
    from draftgate.gates import gx as gx_run  # noqa: F401  (GX and the custom expectations loaded)
    from draftgate.gates.validate import run_gate

    data = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3], "m": ["a", "a", "b"]}), data)
    suite = Suite(name="t", path="t.json", sha256="", params_section="t", expectations=(
        ExpectationSpec("expect_column_values_to_be_between", {"column": "x", "min_value": 0}),
        ExpectationSpec("expect_column_value_fraction_between", {"column": "m", "value": "a", "min_value": 0.5}),
        ExpectationSpec("expect_column_mean_to_be_between", {"column": "x", "max_value": 2})))
    before = gx_attributes()

    assert run_gate(suite, [Input("t", str(data))], docs=tmp_path / "docs").success
    assert run_gate(suite, [Input("t", str(data))]).success

    after = gx_attributes()
    assert [k for k in before if k in after and after[k] != before[k] and k not in GX_OWN_CACHES] == []


# ------------------------------------------------------------ results in the suite's order

# Every kind of GX result the gate reports: map checks failing with samples, passing ones,
# aggregates, custom expectations, a row count, a missing column, and the kinds the suites use.
MIXED_SUITE = [
    ("expect_column_values_to_not_be_null", {"column": "prompt_id"}),
    ("expect_column_values_to_be_unique", {"column": "prompt_id"}),
    ("expect_column_values_to_be_in_set", {"column": "match", "value_set": ["exact", "bpe_only"]}),
    ("expect_column_values_to_be_in_set", {"column": "method", "value_set": ["truth", "text"], "mostly": 0.5}),
    ("expect_column_values_to_be_between", {"column": "n_completion", "min_value": 1, "max_value": 4096}),
    ("expect_column_mean_to_be_between", {"column": "billing_delta", "min_value": -1, "max_value": 1}),
    ("expect_column_values_to_be_null", {"column": "quarantine_reason"}),
    ("expect_column_value_fraction_between", {"column": "match", "value": "exact", "min_value": 0.5}),
    ("expect_column_sum_ratio_between", {"column": "billing_delta", "denominator_column": "billed_completion_tokens",
                                         "absolute": True, "max_value": 0.0004}),
    ("expect_table_row_count_to_be_between", {"min_value": 1}),
    ("expect_column_values_to_not_be_null", {"column": "no_such_column"}),
    ("expect_column_values_to_match_regex", {"column": "prompt_id", "regex": "^p[0-9]$"}),
    ("expect_column_values_to_not_be_in_set", {"column": "method", "value_set": ["logprobs"]}),
    ("expect_column_values_to_be_json_parseable", {"column": "messages"}),
    ("expect_column_values_json_roles_valid", {"column": "messages", "last_roles": ["user"]}),
    ("expect_column_max_to_be_between", {"column": "n_completion", "max_value": 100}),
    ("expect_column_min_to_be_between", {"column": "n_completion", "min_value": 0}),
    ("expect_column_pair_values_to_be_equal", {"column_A": "n_completion", "column_B": "n_billed"}),
    ("expect_table_columns_to_match_set", {"column_set": ["prompt_id", "match"], "exact_match": False}),
]
# What each check concludes on mixed_table(): 14 of 19 fail.
MIXED_VERDICTS = [False, False, False, True, False, False, False, True, False, True, False, False, False,
                  False, False, False, True, False, True]


def mixed_table(tmp_path) -> Path:
    n = 200
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({
        "prompt_id": [None if i == 7 else f"p{i % 190}" for i in range(n)],    # a null, 10 duplicated ids
        "match": ["exact"] * 150 + ["bpe_only"] * 40 + ["semantic"] * 10,
        "method": ["truth", "text", "logprobs", None] * (n // 4),
        "n_completion": [0 if i % 50 == 0 else 10 + i for i in range(n)],
        "billing_delta": [3 if i < 90 else 0 for i in range(n)],
        "billed_completion_tokens": [100] * n,
        "quarantine_reason": [None] * (n - 1) + ["empty_completion"],
        "messages": ['[{"role": "user", "content": "q"}]', '[{"role": "bot"}]', "{", None] * (n // 4),
        "n_billed": [0 if i % 50 == 0 else 10 + i + (i % 7 == 0) for i in range(n)],
    }), path)
    return path


def test_each_gx_result_lands_on_the_suite_entry_it_came_from(tmp_path):
    from draftgate.gates.validate import run_gate

    suite = Suite(name="mixed", path="mixed.json", sha256="", params_section="mixed",
                  expectations=tuple(ExpectationSpec(t, kw) for t, kw in MIXED_SUITE))

    run = run_gate(suite, [Input("t", str(mixed_table(tmp_path)))])

    entries = run.result["expectations"]
    assert [(e["type"], e["kwargs"]) for e in entries] == MIXED_SUITE
    assert [e["success"] for e in entries] == MIXED_VERDICTS
    assert run.result["statistics"]["unsuccessful"] == 14
    assert entries[1]["unexpected_count"] == 18 and entries[1]["unexpected_sample"][:2] == ["p0", "p1"]
    assert entries[5]["observed_value"] == pytest.approx(1.35)          # 90 rows of 3 over 200
    assert entries[7]["observed_value"] == 0.75 and entries[8]["observed_value"] == pytest.approx(270 / 20000)
    assert 'column "no_such_column"' in entries[10]["exception"]
