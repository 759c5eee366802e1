"""`draftgate report`: one static page, reports/index.html, readable offline.

    draftgate report                       # reports/index.html (+ reports/audit.duckdb, reports/audit.csv)
    draftgate report --out /tmp/r/index.html --no-exp

It rebuilds the Data Docs site (reports/data_docs/) from the gates' records, data/gates/*.details.json
(draftgate/lineage/datadocs.py: every gate with a record has its page, whether it reran here or not), links
each gate's page beside its verdict and the time of its record, shows every plot dvc.yaml
declares as inline SVG, drawn by Vega (vl-convert, offline) from the same definition `dvc plots
show` reads (which loads Vega from a CDN, blank for an offline reader), the audit summary over
every commit and experiment, and the lineage of the artifacts the report stage reads (the
drafter and its evaluation), else of each final artifact. No script, no remote URL:
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
from draftgate.lineage.collect import collect_all
from draftgate.lineage.db import summary, write_db
from draftgate.lineage.render import COMPACT, cell, render
from draftgate.lineage.pipeline import Pipeline
from draftgate.lineage.snapshot import WORKSPACE, RevisionError, open_revision, repo_root

DEFAULT_OUT = "reports/index.html"
REPORT_CMD = re.compile(r"(^|\s)(draftgate\s+report|-m\s+stages\.report)(\s|$)")     # this page's own stage: not an artifact to trace
DATA_DOCS = "reports/data_docs/index.html"
DATA_DOCS_SITE = "reports/data_docs"

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
th{background:#f4f4f4}.pass{color:#1a7f37}.fail{color:#cf222e;font-weight:bold}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:12px}.plot{margin:1em 0}
.muted{color:#666}
.banner{padding:.7em 1em;border-radius:6px;margin:1em 0;font-size:1.05em}
.banner.fail{background:#ffebe9;border:1px solid #ff8182}.banner.pass{background:#dafbe1;border:1px solid #4ac26b}
.banner.none{background:#fff8c5;border:1px solid #d4a72c}
table.gates td{vertical-align:top}td.figs{max-width:32em;overflow-wrap:anywhere}
.stale{background:#fff8c5;border:1px solid #d4a72c;border-radius:10px;padding:0 6px;font-size:11px;white-space:nowrap}
ul.failures li{margin:.2em 0}
"""


# ------------------------------------------------------------ plots

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


def _numeric(rows: list[dict], col: str) -> bool:
    return bool(rows) and all(_float(r.get(col)) is not None for r in rows)


def vega_spec(plot: dict, fields: list[str], rows: list[dict]) -> dict | None:
    """The Vega-Lite spec of a dvc.yaml plot (x, y, template, title, x_label, y_label), the chart
    `dvc plots show` draws from the same definition: `linear` (DVC's default) a line, a `bar_*`
    template or a categorical x bars with their values on them. Several y columns, or a text column
    besides x and y (plots/eval_per_position.csv: one row per position and setting), are series:
    one line or bar group each, with a legend. None: nothing numeric to draw."""
    x, ys = series_of(plot, fields, rows)
    ys = [y for y in ys if _numeric(rows, y)]
    if not rows or not ys:
        return None
    index = x is None
    x = x or "step"
    values = [{**{k: (_float(v) if k in ys or (k == x and _numeric(rows, x)) else v) for k, v in r.items()},
               **({"step": i} if index else {})} for i, r in enumerate(rows)]
    template = str(plot.get("template") or "")
    x_numeric = index or _numeric(rows, x)
    bars = template.startswith("bar") or not x_numeric
    series = next((f for f in fields if f not in (x, *ys) and not _numeric(rows, f)), None) if len(ys) == 1 else None
    y_field = ys[0]
    transform = []
    if len(ys) > 1:     # DVC draws each y column as its own series
        transform, series, y_field = [{"fold": ys, "as": ["series", "value"]}], "series", "value"
    x_enc = {"field": x, "type": "quantitative" if x_numeric and not bars else "nominal" if bars else "ordinal",
             "title": plot.get("x_label") or x}
    if bars:
        x_enc.update(sort=None, axis={"labelAngle": 0})       # the file's order, as DVC shows it
    elif all(float(v[x]).is_integer() for v in values):   # positions and steps: no tick at 1.5
        ticks = sorted({int(v[x]) for v in values})
        x_enc["axis"] = {"values": ticks} if len(ticks) <= 20 else {"format": "d", "tickMinStep": 1}
    y_enc = {"field": y_field, "type": "quantitative", "title": plot.get("y_label") or (ys[0] if len(ys) == 1 else "value")}
    if not bars:    # a loss falling from 26 to 20 drawn from 0 looks flat: the axis spans the data
        y_enc["scale"] = {"zero": False}
    enc: dict[str, Any] = {"x": x_enc, "y": y_enc}
    if series:
        enc["color"] = {"field": series, "type": "nominal", "title": series}
        if bars:
            enc["xOffset"] = {"field": series}
    mark: dict[str, Any] = {"type": "bar"} if bars else {"type": "line", "point": len(rows) <= 60}
    layers: list[dict] = [{"mark": mark, "encoding": enc}]
    if bars:    # the value on each bar
        layers.append({"mark": {"type": "text", "dy": -5, "fontSize": 10},
                       "encoding": {**enc, "text": {"field": y_field, "type": "quantitative", "format": ".4~g"}}})
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json",
            "title": str(plot.get("title") or plot["path"]), "width": 560, "height": 240,
            "data": {"values": values}, "transform": transform, "layer": layers}


def caption(plot: dict) -> str:
    """What the chart shows, from its dvc.yaml definition: its axes and the stage that drew it."""
    x, y = plot.get("x_label") or plot.get("x") or "row", plot.get("y_label") or plot.get("y") or "value"
    by = f", written by stage {plot['stage']}" if plot.get("stage") else ""
    return f"{plot.get('title') or plot['path']}: {y} by {x}{by}. Data:"


def render_svg(spec: dict) -> str:
    """SVG drawn by Vega itself (vl-convert: Vega-Lite and Vega in one wheel, no browser, no
    network; ~1.5 s for the first chart of a process, ~0.2 s each after)."""
    import vl_convert

    svg = vl_convert.vegalite_to_svg(spec)
    return svg[svg.index("<svg"):]     # the XML declaration does not belong inside an HTML page


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
    Each gate's own page (draftgate/gates/page.py) is rewritten from the same record at the path the
    gate printed, so a gate DVC found up to date has one too. GX is imported only here (~3 s)."""
    from draftgate.gates import page as gate_page
    from draftgate.lineage import datadocs as site

    pipe = Pipeline.at(open_revision(root, WORKSPACE))
    gates = {st.name: details_path(st.metrics[0].path) for st in pipe.stages.values() if st.is_gate and st.metrics}
    records = site.read_records(root, gates)
    pages = site.rebuild(root / DATA_DOCS_SITE, records)
    dvc_yaml = gate_page.read_dvc_yaml(root)
    for r in records:
        gate_page.write(r.result, DATA_DOCS_SITE, root=root, record=gates[r.gate], dvc_yaml=dvc_yaml)
    return {r.gate: (f"{DATA_DOCS_SITE}/{pages[r.gate]}", r) for r in records if r.gate in pages}


def gate_page_of(root: Path, record: Any) -> Path:
    from draftgate.gates.page import page_path

    return page_path(root / DATA_DOCS_SITE, record.suite)


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
    parts.append('<h2 id="gates">Gates</h2>')
    parts.append(f'<p class=muted>Each gate links its own page (the verdict, the root failure first, the offending '
                 f'rows, the stage to rerun); <a href="{_rel(docs, page_dir)}">Data Docs</a> hold every check as Great '
                 "Expectations renders it.</p>" if docs.is_file() else
                 "<p class=muted>No Data Docs yet: the gate stages write them (`dvc repro`).</p>")
    from draftgate.lineage import datadocs, verdicts

    gates = {st.name: details_path(st.metrics[0].path) for st in pipe.stages.values() if st.is_gate and st.metrics}
    records = datadocs.read_records(root, gates)
    parts.append(verdicts.section(root, page_dir, root / DATA_DOCS_SITE, pipe, records,
                                  {g: p for g, (p, _) in (docs_pages or {}).items()}))

    parts.append("<h2>Plots</h2>")
    plots = pipe.plots()
    if not plots:
        parts.append("<p class=muted>dvc.yaml declares no plots.</p>")
    for plot in plots:
        path = root / plot["path"]
        if not path.is_file():
            parts.append(f"<p class=muted>{html.escape(plot['path'])}: not written yet</p>")
            continue
        spec = vega_spec(plot, *read_plot(path))
        chart = render_svg(spec) if spec else f'<p class="muted">{html.escape(plot["path"])}: no numeric data to draw</p>'
        parts.append(f'<figure class=plot>{chart}<figcaption>{html.escape(caption(plot))} '
                     f'<a href="{_rel(path, page_dir)}">{html.escape(plot["path"])}</a></figcaption></figure>')

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

    parts.append("<h2>Lineage</h2>")
    for path in traced_artifacts(pipe):
        try:
            text = lineage.render(lineage.lineage(path, root))
        except RevisionError as e:
            text = str(e)
        parts.append(f'<details open id="lineage-{_anchor(path)}"><summary>{html.escape(path)}</summary>'
                     f"<pre>{html.escape(text)}</pre></details>")
    parts.append("</body></html>\n")
    return "".join(parts)


def _anchor(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", path).strip("-")


def traced_artifacts(pipe: Pipeline) -> list[str]:
    """Whose lineage the page shows: the artifacts the report stage of dvc.yaml reads (data/drafter,
    the model a user ships, and data/eval, what it was measured to do), else the final artifacts.
    Listing them as the stage's deps also reruns the page when one of them changes."""
    stage = next((st for st in pipe.stages.values() if REPORT_CMD.search(st.cmd)), None)
    producing = [st for st in pipe.stages.values() if not st.is_gate and st is not stage]
    read = [d.path.rstrip("/") for d in (stage.deps if stage else [])
            if any(o.path.rstrip("/") == d.path.rstrip("/") or d.path.startswith(o.path.rstrip("/") + "/")
                   for st in producing for o in st.data_outs)]
    return read or final_artifacts(pipe)


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
