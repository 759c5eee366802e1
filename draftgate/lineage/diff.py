"""`draftgate audit --diff A B`: what changed between two revisions, as rows of {section, key, a, b}."""

from __future__ import annotations

from typing import Any

from draftgate.lineage.collect import Revision


def diff(a: Revision, b: Revision) -> list[dict]:
    """What changed from A to B: rows of {section, key, a, b}, only where they differ.

    sections: params, artifact (outs, metrics and plots by path), source/suite/code (deps no stage
    writes), fingerprint, figure (every number of every metric file), gate (verdict, suite md5 and
    sha256, failed count, the gate's figures), generation (spend), stage (added or removed)."""
    rows: list[dict] = []

    def cmp(section: str, da: dict, db: dict) -> None:
        for key in sorted(set(da) | set(db)):
            va, vb = da.get(key), db.get(key)
            if va != vb:
                rows.append({"section": section, "key": key, "a": va, "b": vb})

    cmp("stage", {s: "ran" if st.locked else "declared" for s, st in a.pipe.stages.items()},
        {s: "ran" if st.locked else "declared" for s, st in b.pipe.stages.items()})
    cmp("params", _params(a), _params(b))
    # Metric files and the details beside them are compared by content below (figure, gate,
    # fingerprint), not by md5: a changed md5 there says nothing the figures do not.
    for role, section in (("out", "artifact"), ("plot", "artifact"), ("dep:source", "source"),
                          ("dep:suite", "suite"), ("dep:code", "code")):
        cmp(section, _md5s(a, role), _md5s(b, role))
    cmp("fingerprint", {src: v for (_, src), v in a.fingerprints.items()},
        {src: v for (_, src), v in b.fingerprints.items()})
    cmp("figure", _stage_figures(a), _stage_figures(b))
    cmp("gate", _gate_facts(a), _gate_facts(b))
    cmp("generation", _generation(a), _generation(b))
    return rows


def _params(r: Revision) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for params in r.params.values():
        out.update(params)
    return out


def _md5s(r: Revision, role: str) -> dict[str, str | None]:
    return {a["path"]: a["md5"] for a in r.artifacts if a["role"] == role and not a["path"].endswith(".details.json")}


def _stage_figures(r: Revision) -> dict[str, float]:
    """Figures of the stages' own metrics (a gate's are in the gate section)."""
    return {f"{file}:{k}": v for (stage, file), figs in r.figures.items() if stage not in r.gates
            for k, v in figs.items()}


def _gate_facts(r: Revision) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, g in r.gates.items():
        out[f"{name}.verdict"] = ("no verdict" if g.get("no_verdict") else "pass" if g["success"] else "FAIL") \
            if g["ran"] else "not run"
        out[f"{name}.suite_md5"] = g["suite_md5"]
        if g.get("suite_sha256"):
            out[f"{name}.suite_sha256"] = g["suite_sha256"]
        out[f"{name}.failed"] = g["failed"]
        for k, v in g["figures"].items():
            out[f"{name}.observed.{k}"] = v
        for k, v in g["unexpected"].items():
            out[f"{name}.unexpected.{k}"] = v
    return out


def _generation(r: Revision) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage, g in r.generation.items():
        for k in ("backend", "model", "spent_usd", "wasted_usd", "journal_spent_usd"):
            out[f"{stage}.{k}"] = g.get(k)
        out[f"{stage}.providers"] = g.get("providers")
    return out
