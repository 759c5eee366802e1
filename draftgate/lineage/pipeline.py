"""dvc.yaml + dvc.lock of one revision as stages and artifacts, and the walk from an artifact upstream.

Built from the two files only, so a stage added to dvc.yaml (hidden, train, eval, their gates) is
covered without a change here. dvc.lock gives what ran: each dep's and out's md5, and the params
the stage read, as DVC recorded them; dvc.yaml adds which outs are metrics and plots (dvc.lock
lists them all as outs) and the stages that never ran. A `foreach`/`matrix` stage appears in
dvc.lock as `name@key`; it takes its metric and plot declarations from its `do:` block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from draftgate.lineage.snapshot import Snapshot

GATE_CMD = re.compile(r"(^|\s)(draftgate\s+validate|-m\s+stages\.gate\w*)\s")
SUITES = "expectations/"


@dataclass
class Artifact:
    path: str
    md5: str | None = None
    size: int | None = None
    nfiles: int | None = None
    kind: str = "out"          # out | metric | plot | dep
    cache: bool = True


@dataclass
class Stage:
    name: str
    cmd: str = ""
    deps: list[Artifact] = field(default_factory=list)
    outs: list[Artifact] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)     # dotted key -> value, as dvc.lock recorded it
    plots: list[dict] = field(default_factory=list)          # {path, x, y}
    locked: bool = False                                     # in dvc.lock: it ran

    @property
    def is_gate(self) -> bool:
        return bool(GATE_CMD.search(self.cmd)) or self.name.startswith("gate_")

    @property
    def metrics(self) -> list[Artifact]:
        return [o for o in self.outs if o.kind == "metric"]

    @property
    def data_outs(self) -> list[Artifact]:
        """What the stage produces for the next one: outs that are neither metrics nor plots, nor the
        details file beside a metric."""
        return [o for o in self.outs if o.kind == "out" and not o.path.endswith(".details.json")]

    @property
    def suite(self) -> Artifact | None:
        return next((d for d in self.deps if d.path.startswith(SUITES)), None)


def _entries(items: Any) -> list[tuple[str, dict]]:
    """dvc.yaml's `- path` or `- path: {opts}` list as (path, opts)."""
    out = []
    for item in items or []:
        if isinstance(item, str):
            out.append((item, {}))
        elif isinstance(item, dict):
            for path, opts in item.items():
                out.append((str(path), opts if isinstance(opts, dict) else {}))
    return out


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"gates.tokens": {"max_semantic": 0}} -> {"gates.tokens.max_semantic": 0}; lists stay values."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value} if prefix else {}


def _declared(yaml_stage: dict) -> tuple[dict[str, dict], dict[str, str], str, list[str]]:
    """From a dvc.yaml stage: {path: opts} of plots, {path: kind} of outs, cmd, deps."""
    body = yaml_stage.get("do", yaml_stage) if isinstance(yaml_stage, dict) else {}
    kinds: dict[str, str] = {}
    plots: dict[str, dict] = {}
    for path, _ in _entries(body.get("outs")):
        kinds[path] = "out"
    for path, _ in _entries(body.get("metrics")):
        kinds[path] = "metric"
    for path, opts in _entries(body.get("plots")):
        kinds[path] = "plot"
        plots[path] = opts
    cmd = body.get("cmd", "")
    cmd = " ".join(cmd) if isinstance(cmd, list) else str(cmd)
    deps = [p for p, _ in _entries(body.get("deps"))]
    return plots, kinds, " ".join(cmd.split()), deps


class Pipeline:
    def __init__(self, dvc_yaml: dict | None, dvc_lock: dict | None):
        ystages = (dvc_yaml or {}).get("stages") or {}
        lstages = (dvc_lock or {}).get("stages") or {}
        self.top_plots = _entries((dvc_yaml or {}).get("plots"))
        self.stages: dict[str, Stage] = {}
        names = list(ystages) + [n for n in lstages if n not in ystages and n.split("@")[0] not in ystages]
        for name in names:
            if name in ystages and any(n.split("@")[0] == name and "@" in n for n in lstages):
                for lname in (n for n in lstages if n.split("@")[0] == name):   # foreach / matrix
                    self.stages[lname] = self._stage(lname, ystages[name], lstages[lname])
            else:
                self.stages[name] = self._stage(name, ystages.get(name) or {}, lstages.get(name))

    @staticmethod
    def _stage(name: str, ystage: dict, lstage: dict | None) -> Stage:
        plots, kinds, cmd, ydeps = _declared(ystage)
        st = Stage(name, cmd=cmd)
        if lstage:
            st.locked = True
            lcmd = lstage.get("cmd", "")
            st.cmd = " ".join((" ".join(lcmd) if isinstance(lcmd, list) else str(lcmd)).split()) or cmd
            st.deps = [Artifact(d["path"], d.get("md5"), d.get("size"), d.get("nfiles"), "dep")
                       for d in lstage.get("deps") or []]
            for o in lstage.get("outs") or []:
                kind = kinds.get(o["path"], "out")
                st.outs.append(Artifact(o["path"], o.get("md5"), o.get("size"), o.get("nfiles"), kind))
            for values in (lstage.get("params") or {}).values():
                st.params.update(flatten(values))
        else:
            st.deps = [Artifact(p, kind="dep") for p in ydeps]
            st.outs = [Artifact(p, kind=k) for p, k in kinds.items()]
        st.plots = [{"path": p, **opts} for p, opts in plots.items()]
        return st

    @classmethod
    def at(cls, snap: Snapshot) -> "Pipeline":
        return cls(snap.yaml("dvc.yaml"), snap.yaml("dvc.lock"))

    # ---------------------------------------------------------------- artifacts

    def producer(self, path: str) -> tuple[Stage, Artifact, str | None] | None:
        """The stage whose out is `path` or a folder holding it, with the part below that folder."""
        path = path.rstrip("/")
        for st in self.stages.values():
            for o in st.outs:
                if path == o.path:
                    return st, o, None
                if path.startswith(o.path.rstrip("/") + "/"):
                    return st, o, path[len(o.path.rstrip("/")) + 1:]
        return None

    def json(self, snap: Snapshot, path: str) -> Any:
        """A JSON file of this revision, from git or disk, else from the DVC cache."""
        found = self.producer(path)
        md5, inner = (found[1].md5, found[2]) if found else (None, None)
        return snap.json(path, md5, inner)

    def upstream(self, name: str) -> list[Stage]:
        """`name` and every stage it depends on, transitively, upstream first (dvc.yaml order among peers)."""
        order = list(self.stages)
        seen: set[str] = set()
        todo = [name]
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            for dep in self.stages[cur].deps:
                for found in self.producers_of_dep(dep.path):
                    todo.append(found.name)
        return [self.stages[n] for n in order if n in seen]

    def producers_of_dep(self, dep: str) -> list[Stage]:
        """Stages producing a dep: its exact out, the folder holding it, or outs inside a folder dep."""
        dep = dep.rstrip("/")
        out = []
        for st in self.stages.values():
            for o in st.outs:
                p = o.path.rstrip("/")
                if dep == p or dep.startswith(p + "/") or p.startswith(dep + "/"):
                    out.append(st)
                    break
        return out

    def gates_over(self, stages: list[Stage]) -> list[Stage]:
        """Gate stages that read an out of `stages` (a gate checks an artifact; it need not be upstream
        of it: gate_drafter reads the drafter and is upstream only of eval)."""
        names = {s.name for s in stages}
        return [g for g in self.stages.values() if g.is_gate and g.name not in names
                and any(st.name in names for d in g.deps for st in self.producers_of_dep(d.path))]

    def plots(self) -> list[dict]:
        """Every plot: {path, x, y, stage}, stage plots then top-level ones."""
        out = [{**p, "stage": st.name} for st in self.stages.values() for p in st.plots]
        seen = {p["path"] for p in out}
        for path, opts in self.top_plots:
            if path not in seen:
                out.append({"path": path, **opts, "stage": None})
        return out
