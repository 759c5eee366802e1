"""`draftgate audit`: every commit and experiment as rows of DuckDB tables; `--diff A B` says what changed.

    draftgate audit                          # summary of every revision; writes reports/audit.duckdb
    draftgate audit --format md              # the same as a Markdown table (csv: every column, full hashes)
    draftgate audit --diff HEAD~1 HEAD       # params, artifacts, code, fingerprints, figures, verdicts
    draftgate audit --diff exp-a exp-b --format csv
    duckdb reports/audit.duckdb "select * from summary"

Revisions: each commit of HEAD's history (and branches) that changed dvc.lock, each experiment DVC
saved (refs/exps; what `dvc exp show --json` lists), and the workspace. Each is read from git as it
was committed (snapshot.py), so the audit needs no checkout and no `dvc` process. The tables and
the queries users need are in docs/lineage.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from draftgate.lineage import facts
from draftgate.lineage.lineage import is_code
from draftgate.lineage.pipeline import Pipeline
from draftgate.lineage.snapshot import WORKSPACE, RevisionError, Snapshot, history, open_revision, repo_root

DEFAULT_DB = "reports/audit.duckdb"

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

TABLES = {
    # seq: commits oldest first, then experiments, then the workspace; head: the commit HEAD points at.
    "runs": ("run VARCHAR, seq INTEGER, kind VARCHAR, rev VARCHAR, baseline VARCHAR, head BOOLEAN, "
             "committed_at TIMESTAMP, subject VARCHAR"),
    "params": "run VARCHAR, stage VARCHAR, key VARCHAR, value JSON",
    "artifacts": "run VARCHAR, stage VARCHAR, path VARCHAR, role VARCHAR, md5 VARCHAR, size BIGINT, nfiles BIGINT",
    "figures": "run VARCHAR, stage VARCHAR, file VARCHAR, key VARCHAR, value DOUBLE",
    "gates": ("run VARCHAR, gate VARCHAR, suite VARCHAR, suite_md5 VARCHAR, suite_sha256 VARCHAR, ran BOOLEAN, "
              "success BOOLEAN, checks BIGINT, failed BIGINT, rows BIGINT, failures JSON"),
    "gate_figures": "run VARCHAR, gate VARCHAR, kind VARCHAR, key VARCHAR, value DOUBLE",
    "fingerprints": "run VARCHAR, stage VARCHAR, source VARCHAR, value VARCHAR",
    "generation": ("run VARCHAR, stage VARCHAR, backend VARCHAR, model VARCHAR, providers JSON, spent_usd DOUBLE, "
                   "wasted_usd DOUBLE, journal_spent_usd DOUBLE"),
    # Which gate-checked artifact each stage read: one row per (stage, gate metric it lists as a dep).
    "gate_deps": "run VARCHAR, stage VARCHAR, gate VARCHAR",
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


# ------------------------------------------------------------ tables

def _when(snap: Snapshot) -> datetime | None:
    return datetime.fromtimestamp(snap.timestamp, timezone.utc).replace(tzinfo=None) if snap.timestamp else None


def table_rows(revs: list[Revision]) -> dict[str, list[tuple]]:
    t: dict[str, list[tuple]] = {name: [] for name in TABLES}
    head = _head_of(revs) if revs else None
    for seq, r in enumerate(revs):
        s, run = r.snap, r.run
        t["runs"].append((run, seq, s.kind, s.rev, s.baseline, s.kind == "commit" and s.rev == head, _when(s),
                          s.subject))
        for stage, params in r.params.items():
            t["params"] += [(run, stage, k, json.dumps(v)) for k, v in params.items()]
        t["artifacts"] += [(run, a["stage"], a["path"], a["role"], a["md5"], a["size"], a["nfiles"]) for a in r.artifacts]
        for (stage, file), figs in r.figures.items():
            t["figures"] += [(run, stage, file, k, float(v)) for k, v in figs.items()]
        for g in r.gates.values():
            t["gates"].append((run, g["gate"], g["suite"], g["suite_md5"], g["suite_sha256"], g["ran"], g["success"],
                               g["checks"], g["failed"], g["rows"], json.dumps(g["failures"])))
            t["gate_figures"] += [(run, g["gate"], "observed", k, float(v)) for k, v in g["figures"].items()]
            t["gate_figures"] += [(run, g["gate"], "unexpected", k, float(v)) for k, v in g["unexpected"].items()]
        t["fingerprints"] += [(run, stage, src, v) for (stage, src), v in r.fingerprints.items()]
        for stage, g in r.generation.items():
            t["generation"].append((run, stage, g["backend"], g["model"], json.dumps(g["providers"]),
                                    g["spent_usd"], g["wasted_usd"], g["journal_spent_usd"]))
        t["gate_deps"] += [(run, stage, gate) for stage, gate in r.gate_deps]
    return t


def _head_of(revs: list[Revision]) -> str | None:
    from draftgate.lineage.snapshot import git

    return git(revs[0].snap.root, "rev-parse", "--verify", "--quiet", "HEAD", check=False).strip() or None


def column(name: str) -> str:
    """data/tokens -> data_tokens: a column name usable in SQL unquoted."""
    return re.sub(r"\W+", "_", name).strip("_").lower()


def summary(revs: list[Revision]) -> list[dict]:
    """One row per revision: headline figures, identity, each gate's verdict and suite md5, spend, and
    the md5 of every data artifact (outs that are neither metrics nor plots)."""
    gates = list(dict.fromkeys(g for r in revs for g in r.gates))
    outs = list(dict.fromkeys(a["path"] for r in revs for a in r.artifacts
                              if a["role"] == "out" and not a["path"].endswith(".details.json")))
    rows = []
    for seq, r in enumerate(revs):
        s = r.snap
        row: dict[str, Any] = {"run": r.run, "seq": seq, "kind": s.kind, "rev": s.rev, "baseline": s.baseline,
                               "committed_at": _when(s), "subject": s.subject}
        for name in HEADLINES:
            row[name] = r.headline(name)
        spent = [g["spent_usd"] for g in r.generation.values() if g.get("spent_usd") is not None]
        wasted = [g["wasted_usd"] for g in r.generation.values() if g.get("wasted_usd") is not None]
        row["spent_usd"] = sum(spent) if spent else None
        row["wasted_usd"] = sum(wasted) if wasted else None
        ident = r.identity()
        for k in ("tokenizer", "template", "weights"):
            row[f"{k}_fingerprint"] = ident.get(k)
        ran = [g for g in r.gates.values() if g["ran"]]
        row["gates_passed"] = sum(1 for g in ran if g["success"])
        row["gates_failed"] = sum(1 for g in ran if not g["success"])
        for name in gates:
            g = r.gates.get(name)
            row[column(name)] = g["success"] if g and g["ran"] else None
            row[f"{column(name)}_suite"] = g["suite_md5"] if g else None
        md5s = {a["path"]: a["md5"] for a in r.artifacts if a["role"] == "out"}
        for path in outs:
            row[f"md5_{column(path)}"] = md5s.get(path)
        rows.append(row)
    return rows


def write_db(revs: list[Revision], db: str | Path) -> Path:
    """A fresh DuckDB file (written beside, then renamed: a reader never sees half a database)."""
    import duckdb

    from draftgate.io import atomic_path

    db = Path(db)
    with atomic_path(db) as tmp:
        tmp.unlink()       # DuckDB refuses to open an empty file as a database
        con = duckdb.connect(str(tmp))
        try:
            rows = table_rows(revs)
            for name, schema in TABLES.items():
                con.execute(f"CREATE TABLE {name} ({schema})")
                if rows[name]:
                    marks = ", ".join("?" * len(rows[name][0]))
                    con.executemany(f"INSERT INTO {name} VALUES ({marks})", rows[name])
            _write_summary(con, summary(revs))
            con.execute("CHECKPOINT")
        finally:
            con.close()
        Path(f"{tmp}.wal").unlink(missing_ok=True)
    return db


def _write_summary(con: Any, rows: list[dict]) -> None:
    if not rows:
        con.execute("CREATE TABLE summary (run VARCHAR)")
        return
    cols = list(rows[0])
    types = {c: FIXED_TYPES.get(c) or _sql_type([r[c] for r in rows]) for c in cols}
    con.execute(f"CREATE TABLE summary ({', '.join(f'{c} {types[c]}' for c in cols)})")
    con.executemany(f"INSERT INTO summary VALUES ({', '.join('?' * len(cols))})", [[r[c] for c in cols] for r in rows])


FIXED_TYPES = {**{name: "DOUBLE" for name in HEADLINES}, "seq": "INTEGER", "committed_at": "TIMESTAMP",
               "spent_usd": "DOUBLE", "wasted_usd": "DOUBLE", "gates_passed": "INTEGER", "gates_failed": "INTEGER"}


def _sql_type(values: list[Any]) -> str:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "BOOLEAN"
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "BIGINT"
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return "DOUBLE"
    if present and all(isinstance(v, datetime) for v in present):
        return "TIMESTAMP"
    return "VARCHAR"


# ------------------------------------------------------------ --diff

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


# ------------------------------------------------------------ output

HASH = re.compile(r"^[0-9a-f]{32,64}(\.dir)?$")
COMPACT = ["run", "kind", "committed_at", "gates_passed", "gates_failed", "mismatch_rate", "billing_agreement",
           "acceptance_length", "spent_usd", "tokenizer_fingerprint", "template_fingerprint", "weights_fingerprint"]


def cell(v: Any, full: bool) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "pass" if v else "FAIL"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M")
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    text = str(v)
    if not full and HASH.match(text):
        return text[:8] + (".dir" if text.endswith(".dir") else "")
    return text


def render(rows: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    cols = columns or list(rows[0])
    full = fmt == "csv"
    cells = [[cell(r.get(c), full) for c in cols] for r in rows]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        w.writerows(cells)
        return buf.getvalue()
    if fmt == "md":
        esc = [[c.replace("|", "\\|") for c in row] for row in cells]
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in esc]) + "\n"
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    widths = [min(w, 60) for w in widths]
    line = lambda vals: "  ".join(v[:w].ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(row) for row in cells]) + "\n"


def build(root: str | Path = ".", db: str | Path | None = DEFAULT_DB, with_experiments: bool = True,
          with_failed: bool = False) -> list[Revision]:
    root = repo_root(root)
    revs = collect_all(root, with_experiments, with_failed)
    if db:
        write_db(revs, root / db if not Path(db).is_absolute() else db)
    return revs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="draftgate audit",
                                 description="Every commit and experiment as DuckDB tables; --diff A B says what changed.")
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"),
                    help="compare two revisions: workspace, a git revision (HEAD~1, a sha) or an experiment's name")
    ap.add_argument("--format", choices=("table", "csv", "md"), default="table")
    ap.add_argument("--db", default=DEFAULT_DB, help=f"the DuckDB file to (re)write (default: {DEFAULT_DB}); "
                                                     "'' for none")
    ap.add_argument("--wide", action="store_true", help="every summary column (csv always has them all)")
    ap.add_argument("--no-exp", action="store_true", help="commits and the workspace only, no experiments")
    ap.add_argument("--no-dvc", action="store_true",
                    help="read git only: no `dvc exp show` for failed experiments (saved ones come from git)")
    ap.add_argument("--repo", default=".", help="the project's root (default: the current directory's repository)")
    args = ap.parse_args(argv)
    try:
        root = repo_root(args.repo)
        if args.diff:
            a, b = (collect(open_revision(root, name)) for name in args.diff)
            missing = [n for n, r in zip(args.diff, (a, b)) if r is None]
            if missing:
                raise RevisionError(f"{', '.join(missing)}: no dvc.yaml stages there")
            rows = diff(a, b)  # type: ignore[arg-type]
            sys.stdout.write(render(rows, args.format, ["section", "key", "a", "b"]) if rows else
                             f"no difference between {args.diff[0]} and {args.diff[1]}\n")
            return 0
        revs = build(root, args.db or None, not args.no_exp, with_failed=not (args.no_exp or args.no_dvc))
    except RevisionError as e:
        print(f"draftgate audit: {e}", file=sys.stderr)
        return 2
    rows = summary(revs)
    cols = None if args.wide or args.format == "csv" else [c for c in COMPACT if rows and c in rows[0]]
    sys.stdout.write(render(rows, args.format, cols))
    if args.db:
        print(f"wrote {args.db} (tables: summary, {', '.join(TABLES)})", file=sys.stderr)
    return 0
