"""The audit's DuckDB file: one table per kind of fact over every revision, and `summary`.

TABLES name the columns (docs/lineage.md has the queries users need); `summary` is one wide row
per revision (headline figures, identity, each gate's verdict and suite md5, spend, artifact md5s),
its column types inferred from the values. Written beside the target, then renamed.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from draftgate.lineage.collect import HEADLINES, Revision
from draftgate.lineage.snapshot import Snapshot

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
                _insert(con, name, [c.split()[0] for c in schema.split(", ")], rows[name])
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
    _insert(con, "summary", cols, [[r[c] for c in cols] for r in rows])


def _insert(con: Any, table: str, cols: list[str], rows: list) -> None:
    """Rows in through one Arrow scan, DuckDB casting each column to the table's type: executemany
    runs one statement a row, and the report's audit spent seconds there."""
    if not rows:
        return
    import pyarrow as pa

    try:
        arrow = pa.table({c: pa.array(list(v), type=pa.string() if all(x is None for x in v) else None)
                          for c, v in zip(cols, zip(*rows))})
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # A column of mixed kinds (a summary VARCHAR): DuckDB's own casts, a statement a row.
        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})", rows)
        return
    con.register("_rows", arrow)
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM _rows")
    finally:
        con.unregister("_rows")


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
