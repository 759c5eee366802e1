"""What a revision's stage files say: gate verdicts, identity fingerprints, generation spend, figures.

Read by convention, never by stage name, so new stages are covered:
- a stage's metric `X.json` has its text beside it in `X.details.json` (draftgate/metrics.py);
- a gate's metric is draftgate/gates/result.py's `metric()`: success, checks, failed, rows,
  observed figures, unexpected counts; its details hold the suite file's sha256 (`suite_sha256`);
- identity fingerprints are keys ending in `fingerprint` or `sha256` in a stage's details, its
  small JSON outs (data/contract/contract.json) and a `manifest.json` at the top of a folder out
  (data/hidden/manifest.json): the tokenizer's, the official template's, the model weights';
- a generation stage is one whose details report `spent_usd` (stages/generate.py).
"""

from __future__ import annotations

import math
import re
from typing import Any

from draftgate.gates.result import figures as gate_figures
from draftgate.lineage.pipeline import Artifact, Pipeline, Stage, flatten
from draftgate.lineage.snapshot import Snapshot

FINGERPRINT = re.compile(r"(fingerprint|sha256)$")
# Lists and these subtrees hold per-file or per-input hashes (a gate's inputs, a manifest's shards),
# not the identity of a tokenizer, template or model.
SKIP = {"artifact", "inputs", "shards", "params", "expectations", "columns_loaded"}
FAILURES_SHOWN = 5


def details_path(path: str) -> str:
    """metrics/generate.json -> metrics/generate.details.json (draftgate/metrics.py's rule)."""
    return path[: -len(".json")] + ".details.json" if path.endswith(".json") else path + ".details.json"


def numbers(value: Any, prefix: str = "") -> dict[str, float]:
    """Every finite number (booleans as 0/1) of a metric file, by dotted key."""
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(numbers(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, (int, float)) and math.isfinite(value):
        out[prefix] = value
    return out


def stage_figures(snap: Snapshot, pipe: Pipeline, st: Stage) -> dict[str, dict[str, float]]:
    """{metric file: {dotted key: number}} for each of the stage's metrics that this revision holds."""
    out = {}
    for m in st.metrics:
        data = pipe.json(snap, m.path)
        if isinstance(data, dict):
            out[m.path] = numbers(data)
    return out


def details(snap: Snapshot, pipe: Pipeline, metric: Artifact) -> dict | None:
    data = pipe.json(snap, details_path(metric.path))
    return data if isinstance(data, dict) else None


def gate(snap: Snapshot, pipe: Pipeline, st: Stage) -> dict:
    """A gate's verdict: {gate, suite, suite_md5, suite_sha256, success, checks, failed, rows,
    figures, unexpected, failures, metric, ran}. `ran` is False where no metric file exists at
    this revision (the gate never ran, or the files were not committed)."""
    metric_file = st.metrics[0] if st.metrics else None
    suite = st.suite
    out: dict[str, Any] = {
        "gate": st.name, "metric": metric_file.path if metric_file else None,
        "suite": suite.path if suite else None, "suite_md5": suite.md5 if suite else None,
        "suite_sha256": None, "success": None, "checks": None, "failed": None, "rows": None,
        "figures": {}, "unexpected": {}, "failures": [], "ran": False,
    }
    if metric_file is None:
        return out
    m = pipe.json(snap, metric_file.path)
    if not isinstance(m, dict):
        return out
    out.update(ran=True, success=bool(m.get("success")), checks=m.get("checks"), failed=m.get("failed"),
               rows=m.get("rows"), no_verdict=bool(m.get("no_verdict")),
               figures=numbers(m.get("observed") or {}), unexpected=numbers(m.get("unexpected") or {}))
    d = details(snap, pipe, metric_file)
    if d:
        # the observed figures live in the details (gates/result.py `metric`); older metric files held them
        out["figures"] = numbers(gate_figures(d)) or out["figures"]
        out["suite_sha256"] = d.get("suite_sha256")
        out["suite_name"] = d.get("suite")
        if d.get("error"):
            out["failures"].append(str(d["error"]))
        for i, e in enumerate(d.get("expectations") or []):
            if not e.get("success") and len(out["failures"]) < FAILURES_SHOWN:
                out["failures"].append(_failure(i, e))
    return out


def _failure(i: int, e: dict) -> str:
    subject = e.get("kwargs", {}).get("column") or "table"
    if e.get("exception"):
        return f"[{i}] {e.get('type')} on {subject}: error: {e['exception']}"
    if "unexpected_count" in e and e.get("observed_value") is None:
        return f"[{i}] {e.get('type')} on {subject}: {e['unexpected_count']} of {e.get('element_count')} rows unexpected"
    return f"[{i}] {e.get('type')} on {subject}: observed {e.get('observed_value')!r}"


def fingerprints(snap: Snapshot, pipe: Pipeline, st: Stage) -> dict[str, str]:
    """{"<file>#<dotted key>": value} of every identity hash the stage's files record."""
    out: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    sources = []
    for o in st.data_outs:
        if o.path.endswith(".json"):
            sources.append(o.path)
        elif not o.path.rsplit("/", 1)[-1].count("."):          # a folder out: its manifest, if any
            sources.append(f"{o.path.rstrip('/')}/manifest.json")
    sources += [details_path(m.path) for m in st.metrics]
    for path in sources:
        data = pipe.json(snap, path)
        if isinstance(data, dict):
            for key, value in _hashes(data):
                if (key, value) not in seen:    # the details often repeat the artifact's own record
                    seen.add((key, value))
                    out[f"{path}#{key}"] = value
    return out


def _hashes(value: dict, prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    found = []
    for k, v in value.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and k not in SKIP and depth < 4:
            found += _hashes(v, key, depth + 1)
        elif isinstance(v, str) and FINGERPRINT.search(str(k)) and not key.startswith("artifact"):
            found.append((key, v))
    return found


def generation(snap: Snapshot, pipe: Pipeline, st: Stage) -> dict | None:
    """Backend, model, providers, spend of a stage that paid for answers (its details report spent_usd)."""
    for m in st.metrics:
        d = details(snap, pipe, m)
        if d is None:     # a metric written before the numbers/details split held everything
            d = pipe.json(snap, m.path)
        if isinstance(d, dict) and "spent_usd" in d:
            p = d.get("params") or {}
            return {"backend": p.get("backend"), "model": p.get("model"), "base_url": p.get("base_url"),
                    "providers": d.get("providers") or {}, "spent_usd": d.get("spent_usd"),
                    "wasted_usd": d.get("wasted_usd"), "journal_spent_usd": d.get("journal_spent_usd"),
                    "budget_usd": d.get("budget_usd", p.get("budget_usd")), "ok": d.get("ok"),
                    "failed": d.get("failed")}
    return None


def identity(fps: dict[str, str]) -> dict[str, str]:
    """The three fingerprints users ask for, picked from a revision's fingerprints by the key that
    holds them inside the file, never by the file's name: data/gates/template.details.json's
    `suite_sha256` is the template gate's suite, not the chat template (the contract's
    `template_contract.official.sha256` is)."""
    picks: dict[str, str | None] = {"tokenizer": None, "template": None, "weights": None}
    for key, value in fps.items():
        k = key.rsplit("#", 1)[-1].lower()
        if k.rsplit(".", 1)[-1] == "suite_sha256" or "hooks" in k:
            continue
        if picks["weights"] is None and "weights" in k:
            picks["weights"] = value
        elif picks["tokenizer"] is None and "tokenizer" in k and "fingerprint" in k:
            picks["tokenizer"] = value
        elif picks["template"] is None and "template" in k and k.endswith("sha256"):
            picks["template"] = value
    return {k: v for k, v in picks.items() if v}


def params_of(pipe: Pipeline) -> dict[str, Any]:
    """Every param any stage read, as dvc.lock recorded it (the same key in two stages agrees: one file)."""
    out: dict[str, Any] = {}
    for st in pipe.stages.values():
        out.update(st.params)
    return out


__all__ = ["details_path", "numbers", "stage_figures", "gate", "fingerprints", "generation", "identity",
           "params_of", "flatten"]
