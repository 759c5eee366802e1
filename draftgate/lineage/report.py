"""`draftgate report`: one static page, reports/index.html, readable offline.

    draftgate report                       # reports/index.html (+ reports/audit.duckdb, reports/audit.csv)
    draftgate report --out /tmp/r/index.html --no-exp

It rebuilds the Data Docs site (reports/data_docs/) from the gates' records, data/gates/*.details.json
(draftgate/lineage/datadocs.py: every gate with a record has its page, whether it reran here or not), links
each gate's page beside its verdict and the time of its record, shows every plot
dvc.yaml declares as inline SVG drawn here from its CSV (`dvc plots show` renders with Vega loaded
from a CDN, which an offline reader cannot fetch), each gate's verdict, the audit summary over
every commit and experiment, and the lineage of each final artifact. No script, no remote URL:
every link is a relative path to a file in the repository.
"""

from __future__ import annotations

import argparse
import csv
import html
import os
import re
import sys
from pathlib import Path
from typing import Any

from draftgate.lineage import lineage
from draftgate.lineage.facts import details_path
from draftgate.lineage.collect import collect, collect_all
from draftgate.lineage.db import summary, write_db
from draftgate.lineage.render import COMPACT, cell, render
from draftgate.lineage.pipeline import Pipeline
from draftgate.lineage.snapshot import WORKSPACE, RevisionError, open_revision, repo_root

DEFAULT_OUT = "reports/index.html"
REPORT_CMD = re.compile(r"(^|\s)(draftgate\s+report|-m\s+stages\.report)(\s|$)")     # this page's own stage: not an artifact to trace
DATA_DOCS = "reports/data_docs/index.html"
DATA_DOCS_SITE = "reports/data_docs"
W, H, PAD_L, PAD_B, PAD_T, PAD_R = 640, 300, 56, 48, 28, 16
COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
th{background:#f4f4f4}.pass{color:#1a7f37}.fail{color:#cf222e;font-weight:bold}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:12px}.plot{margin:1em 0}
.muted{color:#666}svg text{font:11px system-ui,sans-serif}
"""


# ------------------------------------------------------------ SVG charts

def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def read_plot(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """A DVC plot file's rows: CSV, or JSON as DVC reads it (an array of objects, or an object
    holding one such array, e.g. {"train": [...]})."""
    if path.suffix.lower() != ".json":
        return read_csv(path)
    import json

    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict):
        data = next((v for v in data.values() if isinstance(v, list)), [])
    rows = [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []
    fields = list(dict.fromkeys(k for r in rows for k in r))
    return fields, rows


def _float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def series_of(plot: dict, fields: list[str], rows: list[dict]) -> tuple[str | None, list[str]]:
    """x and the y columns of a plot: as declared (a name, a list, or {file: names}), else every
    numeric column but x; no x means the row's index (DVC's `step`)."""
    x = plot.get("x") if isinstance(plot.get("x"), str) else None
    y = plot.get("y")
    if isinstance(y, dict):
        y = [c for v in y.values() for c in ([v] if isinstance(v, str) else v)]
    ys = [y] if isinstance(y, str) else list(y or [])
    if not ys:
        ys = [f for f in fields if f != x and rows and all(_float(r.get(f)) is not None for r in rows)]
    return x, [c for c in ys if c in fields]


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def svg_chart(title: str, rows: list[dict], x: str | None, ys: list[str]) -> str:
    """A bar chart (categorical x) or a line chart (numeric x), grouped by y column."""
    labels = [r.get(x, "") if x else str(i) for i, r in enumerate(rows)]
    values = {y: [_float(r.get(y)) for r in rows] for y in ys}
    flat = [v for vs in values.values() for v in vs if v is not None]
    if not rows or not ys or not flat:
        return f'<p class="muted">{html.escape(title)}: no numeric data to draw</p>'
    lo, hi = min(0.0, min(flat)), max(flat)
    hi = hi if hi > lo else lo + 1
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    ypix = lambda v: PAD_T + ph - (v - lo) / (hi - lo) * ph  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
             f'aria-label="{html.escape(title)}">', f'<title>{html.escape(title)}</title>',
             f'<text x="{PAD_L}" y="16" font-weight="bold">{html.escape(title)}</text>']
    for t in _ticks(lo, hi):
        yy = ypix(t)
        parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                     f'<text x="{PAD_L - 4}" y="{yy + 4:.1f}" text-anchor="end">{t:.4g}</text>')
    parts.append(f'<line x1="{PAD_L}" x2="{PAD_L}" y1="{PAD_T}" y2="{PAD_T + ph}" stroke="#999"/>'
                 f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{PAD_T + ph}" y2="{PAD_T + ph}" stroke="#999"/>')
    xs = [_float(v) for v in labels]
    numeric_x = x is None or all(v is not None for v in xs)
    if numeric_x and len(rows) > 1:
        xv = [float(v) if v is not None else float(i) for i, v in enumerate(xs)]
        x0, x1 = min(xv), max(xv) if max(xv) > min(xv) else min(xv) + 1
        xpix = lambda v: PAD_L + (v - x0) / (x1 - x0) * pw  # noqa: E731
        for t in _ticks(x0, x1):
            parts.append(f'<text x="{xpix(t):.1f}" y="{PAD_T + ph + 14}" text-anchor="middle">{t:.4g}</text>')
        for k, y in enumerate(ys):
            pts = " ".join(f"{xpix(a):.1f},{ypix(b):.1f}" for a, b in zip(xv, values[y]) if b is not None)
            parts.append(f'<polyline fill="none" stroke="{COLORS[k % len(COLORS)]}" stroke-width="1.5" points="{pts}"/>')
    else:
        group = pw / len(rows)
        bw = group * 0.8 / len(ys)
        for i, label in enumerate(labels):
            gx = PAD_L + i * group + group * 0.1
            for k, y in enumerate(ys):
                v = values[y][i]
                if v is None:
                    continue
                top, base = ypix(max(v, 0.0)), ypix(min(v, 0.0))
                parts.append(f'<rect x="{gx + k * bw:.1f}" y="{top:.1f}" width="{bw:.1f}" height="{base - top:.1f}" '
                             f'fill="{COLORS[k % len(COLORS)]}"><title>{html.escape(f"{label} {y}: {v:.6g}")}</title></rect>')
            parts.append(f'<text x="{gx + group * 0.4:.1f}" y="{PAD_T + ph + 14}" text-anchor="middle">'
                         f'{html.escape(str(label)[:16])}</text>')
    parts.append(f'<text x="{PAD_L + pw / 2:.1f}" y="{H - 8}" text-anchor="middle">{html.escape(x or "step")}</text>')
    for k, y in enumerate(ys):
        lx = W - PAD_R - 150
        parts.append(f'<rect x="{lx}" y="{6 + k * 14}" width="10" height="10" fill="{COLORS[k % len(COLORS)]}"/>'
                     f'<text x="{lx + 14}" y="{15 + k * 14}">{html.escape(y)}</text>')
    parts.append("</svg>")
    return "".join(parts)


# ------------------------------------------------------------ the page

def _rel(target: Path, page_dir: Path) -> str:
    return Path(os.path.relpath(target, page_dir)).as_posix()


class Link(str):
    """A table cell that links a file: its text, and `href` relative to the page."""
    href: str

    def __new__(cls, text: str, href: str):
        obj = super().__new__(cls, text)
        obj.href = href
        return obj


def _table(rows: list[dict], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for r in rows:
        tds = []
        for c in cols:
            v = r.get(c)
            text = html.escape(cell(v, full=False))
            if isinstance(v, Link):
                text = f'<a href="{html.escape(v.href)}">{text}</a>'
            cls = ' class="pass"' if v is True else ' class="fail"' if v is False else ""
            tds.append(f"<td{cls}>{text}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<div style=\"overflow-x:auto\"><table><tr>{head}</tr>{''.join(body)}</table></div>"


def rebuild_data_docs(root: Path) -> dict[str, tuple[str, Any]]:
    """The Data Docs site from the workspace's gate records: {gate: (page relative to root, Record)}.
    GX is imported only here (~3 s)."""
    from draftgate.lineage import datadocs as site

    pipe = Pipeline.at(open_revision(root, WORKSPACE))
    gates = {st.name: details_path(st.metrics[0].path) for st in pipe.stages.values() if st.is_gate and st.metrics}
    records = site.read_records(root, gates)
    pages = site.rebuild(root / DATA_DOCS_SITE, records)
    return {r.gate: (f"{DATA_DOCS_SITE}/{pages[r.gate]}", r) for r in records if r.gate in pages}


def build_page(root: Path, out: Path, with_experiments: bool = True, db: Path | None = None,
               docs_pages: dict[str, tuple[str, Any]] | None = None) -> str:
    """`docs_pages`: rebuild_data_docs()'s answer, linked beside each gate; None: the site as it is."""
    page_dir = out.parent
    snap = open_revision(root, WORKSPACE)
    pipe = Pipeline.at(snap)
    commit = snap.baseline[:8] if snap.baseline else "no commit"
    parts = ["<!doctype html><html lang=en><head><meta charset=utf-8>",
             "<title>draftgate report</title>", f"<style>{CSS}</style></head><body>",
             f"<h1>draftgate report</h1><p class=muted>workspace on commit {html.escape(commit)}; "
             "every link below is a file in this repository, readable offline.</p>"]

    docs = root / DATA_DOCS
    parts.append("<h2>Gates</h2>")
    parts.append(f'<p><a href="{_rel(docs, page_dir)}">Data Docs</a>: every check of every gate, with its '
                 "note, observed values and unexpected rows, rebuilt from the gates' records "
                 "(data/gates/*.details.json).</p>" if docs.is_file() else
                 "<p class=muted>No Data Docs yet: the gate stages write them (`dvc repro`).</p>")
    rev = collect(snap)
    gate_rows = []
    for g in (rev.gates.values() if rev else []):
        figures = ", ".join(f"{k} {cell(v, False)}" for k, v in list(g["figures"].items())[:6])
        linked = (docs_pages or {}).get(g["gate"])
        gate_rows.append({"gate": Link(g["gate"], _rel(root / linked[0], page_dir)) if linked else g["gate"],
                          "recorded": f"{linked[1].run_time:%Y-%m-%d %H:%M:%S} UTC ({linked[1].run_name})" if linked else None,
                          "verdict": g["success"] if g["ran"] else None,
                          "checks": g["checks"], "failed": g["failed"], "rows": g["rows"],
                          "suite": g["suite"], "suite md5": g["suite_md5"], "figures": figures,
                          "failures": "; ".join(g["failures"])})
    if gate_rows:
        parts.append(_table(gate_rows, list(gate_rows[0])))

    parts.append("<h2>Plots</h2>")
    plots = pipe.plots()
    if not plots:
        parts.append("<p class=muted>dvc.yaml declares no plots.</p>")
    for plot in plots:
        path = root / plot["path"]
        if not path.is_file():
            parts.append(f"<p class=muted>{html.escape(plot['path'])}: not written yet</p>")
            continue
        fields, rows = read_plot(path)
        x, ys = series_of(plot, fields, rows)
        title = plot.get("title") or plot["path"]
        parts.append(f'<div class=plot>{svg_chart(str(title), rows, x, ys)}'
                     f'<br><a href="{_rel(path, page_dir)}">{html.escape(plot["path"])}</a></div>')

    parts.append("<h2>Audit</h2>")
    revs = collect_all(root, with_experiments)
    rows = summary(revs)
    if db is not None:
        write_db(revs, db)
        csv_path = db.with_suffix(".csv")
        from draftgate.io import write_text

        write_text(csv_path, render(rows, "csv"))
        parts.append(f'<p>Every column: <a href="{_rel(csv_path, page_dir)}">{html.escape(csv_path.name)}</a>; '
                     f'the tables: <a href="{_rel(db, page_dir)}">{html.escape(db.name)}</a> '
                     "(open with DuckDB; queries in docs/lineage.md).</p>")
    cols = [c for c in COMPACT if rows and c in rows[0]]
    gate_cols = [c for c in (rows[0] if rows else {}) if c.startswith("gate_") and not c.endswith("_suite")]
    parts.append(_table(rows, cols + gate_cols) if rows else "<p class=muted>No revision has a dvc.lock yet.</p>")

    parts.append("<h2>Lineage of the final artifacts</h2>")
    for path in final_artifacts(pipe):
        try:
            text = lineage.render(lineage.lineage(path, root))
        except RevisionError as e:
            text = str(e)
        parts.append(f"<details><summary>{html.escape(path)}</summary><pre>{html.escape(text)}</pre></details>")
    parts.append("</body></html>\n")
    return "".join(parts)


def final_artifacts(pipe: Pipeline) -> list[str]:
    """The data outs of the stages the pipeline ends in: stages that ran whose outs no other
    producing stage reads (gates read them, and are left out: they check, they do not consume)."""
    producing = [st for st in pipe.stages.values() if not st.is_gate and not REPORT_CMD.search(st.cmd)]
    sinks = [st for st in producing if st.locked and not any(
        s.name != st.name and any(_overlaps(d.path, o.path) for d in s.deps for o in st.data_outs) for s in producing)]
    return [o.path for st in sinks for o in st.data_outs]


def _overlaps(a: str, b: str) -> bool:
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="draftgate report", description="reports/index.html: Data Docs link, plots "
                                 "as inline SVG, gate verdicts, the audit, lineage; static and offline.")
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"the page (default: {DEFAULT_OUT})")
    ap.add_argument("--db", default="reports/audit.duckdb",
                    help="write the audit tables here (and its CSV beside it), linked from the page; '' for none")
    ap.add_argument("--no-exp", action="store_true", help="commits and the workspace only, no experiments")
    ap.add_argument("--repo", default=".", help="the project's root")
    ap.add_argument("--no-docs", action="store_true", help="leave the Data Docs site as the gates left it")
    args = ap.parse_args(argv)
    try:
        root = repo_root(args.repo)
        out = Path(args.out) if Path(args.out).is_absolute() else root / args.out
        db = (Path(args.db) if Path(args.db).is_absolute() else root / args.db) if args.db else None
        pages = None if args.no_docs else rebuild_data_docs(root)
        page = build_page(root, out, not args.no_exp, db, pages)
    except RevisionError as e:
        print(f"draftgate report: {e}", file=sys.stderr)
        return 2
    from draftgate.io import write_text

    write_text(out, page)
    print(f"wrote {out}")
    return 0
