"""One revision of the project as plain Python: what the audit's tables and --diff are made of.

A Revision is read from git as it was committed (snapshot.py) through its dvc.yaml and dvc.lock
(pipeline.py): params per stage, every dep and out with its md5 and role, the figures of each
metric file, gate verdicts, fingerprints, spend, and which gate each stage's input passed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgate.lineage import facts
from draftgate.lineage.lineage import is_code
from draftgate.lineage.pipeline import Pipeline
from draftgate.lineage.snapshot import Snapshot, history

# Headline figures of the summary: the first figure (by metric file, then key) whose dotted key
# matches. New stages need no change as long as their metrics name the figure the same way
# (the eval stage's acceptance length: a key ending in `acceptance_length`).
HEADLINES: dict[str, list[str]] = {
    "mismatch_rate": [r"^datasets\.all\.mismatch_rate$", r"(^|\.)mismatch_rate$"],
    "billing_agreement": [r"^datasets\.all\.billing_row_agreement$", r"^billing\.completion\.row_agreement$"],
    "prompt_billing_agreement": [r"^datasets\.all\.prompt_billing_row_agreement$",
                                 r"^billing\.prompt\.row_agreement$"],
    # The eval stage's metric (stages/eval.py): the drafter's figures under `drafter.` (ngram, oracle
    # and random baselines sit beside it and must not be taken for it).
    "acceptance_length": [r"^acceptance_length$", r"^drafter\.acceptance_length$", r"^runs\.eagle3\.acceptance_length$"],
    "acceptance_ci95_low": [r"^ci95\.low$", r"^drafter\.ci95\.low$"],
    "acceptance_ci95_high": [r"^ci95\.high$", r"^drafter\.ci95\.high$"],
}


@dataclass
class Revision:
    """Everything the audit knows about one revision, as plain Python (tables and --diff share it)."""
    snap: Snapshot
    pipe: Pipeline
    params: dict[str, dict[str, Any]] = field(default_factory=dict)      # stage -> key -> value
    artifacts: list[dict] = field(default_factory=list)
    figures: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)   # (stage, file) -> figures
    gates: dict[str, dict] = field(default_factory=dict)
    fingerprints: dict[tuple[str, str], str] = field(default_factory=dict)  # (stage, source) -> value
    generation: dict[str, dict] = field(default_factory=dict)
    gate_deps: list[tuple[str, str]] = field(default_factory=list)

    @property
    def run(self) -> str:
        return self.snap.label

    def all_figures(self) -> dict[str, float]:
        return {f"{file}:{k}": v for (_, file), figs in self.figures.items() for k, v in figs.items()}

    def headline(self, name: str) -> float | None:
        flat = [(file, k, v) for (_, file), figs in sorted(self.figures.items(), key=lambda kv: kv[0][1])
                for k, v in figs.items()]
        for pattern in HEADLINES[name]:
            rx = re.compile(pattern)
            for _, k, v in flat:
                if rx.search(k):
                    return v
        return None

    def identity(self) -> dict[str, str]:
        return facts.identity({src: v for (_, src), v in self.fingerprints.items()})


def collect(snap: Snapshot) -> Revision | None:
    pipe = Pipeline.at(snap)
    if snap.kind == "failed":
        return Revision(snap, pipe)      # a row saying so: its name and DVC's error, no data
    if not pipe.stages:
        return None
    rev = Revision(snap, pipe)
    gate_metrics = {m.path: st.name for st in pipe.stages.values() if st.is_gate for m in st.metrics}
    for st in pipe.stages.values():
        if st.params:
            rev.params[st.name] = st.params
        for d in st.deps:
            role = ("artifact" if any(p.name != st.name for p in pipe.producers_of_dep(d.path)) else
                    "suite" if d.path.startswith("expectations/") else "code" if is_code(snap.root, d.path) else "source")
            rev.artifacts.append({"stage": st.name, "path": d.path, "role": f"dep:{role}", "md5": d.md5,
                                  "size": d.size, "nfiles": d.nfiles})
            if d.path in gate_metrics:
                rev.gate_deps.append((st.name, gate_metrics[d.path]))
        for o in st.outs:
            rev.artifacts.append({"stage": st.name, "path": o.path, "role": o.kind, "md5": o.md5, "size": o.size,
                                  "nfiles": o.nfiles})
        for file, figs in facts.stage_figures(snap, pipe, st).items():
            rev.figures[(st.name, file)] = figs
        for src, value in facts.fingerprints(snap, pipe, st).items():
            rev.fingerprints[(st.name, src)] = value
        gen = facts.generation(snap, pipe, st)
        if gen:
            rev.generation[st.name] = gen
        if st.is_gate:
            rev.gates[st.name] = facts.gate(snap, pipe, st)
    return rev


def collect_all(root: Path, with_experiments: bool = True, with_failed: bool = False) -> list[Revision]:
    revs = [r for r in (collect(s) for s in history(root, with_experiments, with_failed=with_failed)) if r is not None]
    for r in revs:
        r.snap.reader and r.snap.reader.close()
    return revs
