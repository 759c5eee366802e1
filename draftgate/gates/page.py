"""A gate's own page: its verdict, the root failure first, the offending rows, and what to do.

The gate writes it the moment it has a verdict (validate.py), from the same result it writes to
data/gates/<suite>.details.json, at a path that depends only on the Data Docs site and the suite:

    reports/data_docs  ->  reports/gates/<suite>.html      (page_path)

So the link a failed gate prints still works after `dvc repro` stopped there, and after the report
stage ran: the report rewrites every gate's page from its record (a gate DVC found up to date never
ran in a fresh clone, yet has its page) and never deletes one. The page is a pure function of the
record and dvc.yaml (no time, no run name): the gate and the report write the same bytes.

Failures are listed in the suite's order, which is the pipeline's own (suite.py): structure
before what is computed from it, so the first failure is the one to fix first (a dropped end id
fails the shape and end-token checks, and then the prompt, billing and mismatch checks that read
the same ids). Each says what was observed against what was expected, in words, with its note,
its offending rows and the stage that wrote the artifact; the banner links the docs page that
explains the gate and its usual fixes (the suite's `meta.docs`). Plain HTML with its style inline: no
script, no network, readable from a zip.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from draftgate.io import write_text

CSS = """
body{font:14px/1.5 system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#1f2328;padding:0 1em}
h1{font-size:1.45em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #d0d7de}
.banner{padding:.7em 1em;border-radius:6px;margin:1em 0;font-size:1.05em}
.banner.fail{background:#ffebe9;border:1px solid #ff8182}.banner.pass{background:#dafbe1;border:1px solid #4ac26b}
.banner.none{background:#fff8c5;border:1px solid #d4a72c}
.check{border:1px solid #d0d7de;border-radius:6px;padding:.6em 1em;margin:1em 0}
.check.root{border:2px solid #cf222e}
.check h3{font-size:1.02em;margin:.1em 0 .4em}.tag{font-size:.8em;padding:1px 6px;border-radius:10px;margin-left:.5em}
.tag.root{background:#cf222e;color:#fff}.tag.after{background:#eaeef2;color:#57606a}
.what{margin:.3em 0}.note{color:#57606a;margin:.3em 0}
table{border-collapse:collapse;font-size:12.5px;margin:.4em 0}
td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.mono{font-family:ui-monospace,monospace;overflow-wrap:anywhere}
code{background:#f6f8fa;padding:1px 4px;border-radius:4px}.muted{color:#57606a}
.scroll{overflow-x:auto}
"""


def page_path(site: str | Path, suite: str) -> Path:
    """reports/data_docs -> reports/gates/<suite>.html: beside the Data Docs site, which the report
    stage replaces whole, never inside it."""
    return Path(site).parent / "gates" / f"{suite}.html"


# ------------------------------------------------------------ where the artifact came from

def _paths(items: Any) -> list[str]:
    out = []
    for item in items or []:
        out += [item] if isinstance(item, str) else [str(k) for k in item] if isinstance(item, dict) else []
    return [p.rstrip("/") for p in out]


def stages_of(dvc_yaml: dict | None, artifact: str | None, record: str | None = None) -> dict[str, str]:
    """{"gate": the stage that writes `record` (the result file), "producer": the stage whose out is
    `artifact` or a folder holding it, "producer_file": its stages/<name>.py} from dvc.yaml; empty
    where there is none (`draftgate validate` run by hand outside a pipeline)."""
    found: dict[str, str] = {}
    stages = (dvc_yaml or {}).get("stages") or {}
    art = (artifact or "").rstrip("/")
    for name, st in stages.items():
        if not isinstance(st, dict):
            continue
        outs = _paths(st.get("outs")) + _paths(st.get("metrics"))
        if record and record.rstrip("/") in outs:
            found["gate"] = name
        if art and "producer" not in found and any(art == o or art.startswith(o + "/") for o in outs) \
                and not name.startswith("gate_"):
            found["producer"] = name
            cmd = " ".join(st.get("cmd")) if isinstance(st.get("cmd"), list) else str(st.get("cmd", ""))
            module = next((w for w in cmd.split() if w.startswith("stages.")), None)
            if module:
                found["producer_file"] = module.replace(".", "/") + ".py"
    return found


def read_dvc_yaml(root: str | Path = ".") -> dict | None:
    import yaml

    path = Path(root) / "dvc.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


# ------------------------------------------------------------ each check in words

def _n(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else json.dumps(v)


def expected(e: dict) -> str:
    """What the check allows, from its kwargs (thresholds already resolved from params.yaml)."""
    kw = e.get("kwargs") or {}
    lo, hi = kw.get("min_value"), kw.get("max_value")
    if "value" in kw:
        return f"exactly {_n(kw['value'])}"
    if lo is not None and hi is not None:
        return f"between {_n(lo)} and {_n(hi)}"
    if hi is not None:
        return f"at most {_n(hi)}" if not kw.get("strict_max") else f"below {_n(hi)}"
    if lo is not None:
        return f"at least {_n(lo)}" if not kw.get("strict_min") else f"above {_n(lo)}"
    if "value_set" in kw:
        return "one of " + ", ".join(_n(v) for v in kw["value_set"])
    return ""


def observed(e: dict) -> str:
    """The outcome in words that cannot be read as a pass: a failed null check says how many rows
    hold a value, not what share is null."""
    t = e.get("type", "")
    if e.get("exception"):
        return f"the check could not run: {e['exception']}"
    if "unexpected_count" in e and e.get("observed_value") is None:
        u, n = e.get("unexpected_count") or 0, e.get("element_count")
        of = f"{_n(u)} of {_n(n)} rows" if n is not None else f"{_n(u)} rows"
        words = {"expect_column_values_to_be_null": f"{of} have a value here; every row should be empty (null)",
                 "expect_column_values_to_not_be_null": f"{of} are null; none should be",
                 "expect_column_values_to_be_unique": f"{of} repeat a value; each should be unique",
                 "expect_column_values_to_be_in_set": f"{of} hold a value outside the allowed set ({expected(e)})",
                 "expect_column_values_to_not_be_in_set": f"{of} hold a forbidden value",
                 "expect_column_values_to_be_between": f"{of} lie outside the allowed range ({expected(e)})",
                 "expect_column_values_to_match_regex": f"{of} do not match {(e.get('kwargs') or {}).get('regex')!r}"}
        return words.get(t, f"{of} unexpected")
    obs = e.get("observed_value")
    limit = expected(e)
    return f"observed {_n(obs)}" + (f"; allowed {limit}" if limit else "")


def title(e: dict) -> str:
    column = (e.get("kwargs") or {}).get("column")
    kind = e.get("type", "").replace("expect_", "").replace("_", " ")
    return f"{column}: {kind}" if column else kind


# ------------------------------------------------------------ the page

def _rows_table(rows: list[dict], header: list[str]) -> str:
    rows = [r for r in rows if isinstance(r, dict)]
    if not rows:
        return ""
    cols = list(dict.fromkeys([*header, *(k for r in rows for k in r)]))
    # A text column that repeats another in every row (the check's column holding the prompt id
    # the key column already shows) is shown once; equal counts are two facts, both kept.
    kept: list[str] = []
    for c in cols:
        if not any(all(isinstance(r.get(c), str) and r.get(c) == r.get(k) for r in rows) for k in kept):
            kept.append(c)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in kept)
    body = "".join("<tr>" + "".join(f'<td class="mono">{html.escape(_cell(r.get(c)))}</td>' for c in kept) + "</tr>"
                   for r in rows)
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def _cell(v: Any) -> str:
    if v is None:
        return "null"
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _link(target: str, page_dir: Path, root: Path) -> str:
    return Path(os.path.relpath(root / target, page_dir)).as_posix()


def render(result: dict, where: dict[str, str] | None = None, record: str | None = None,
           page_dir: Path | None = None, root: Path | None = None) -> str:
    """The page of one gate result (validate.py's result dict, or its no-verdict record).
    `where`: stages_of()'s answer; `record`: the result file's path, relative to `root`;
    `page_dir`/`root`: where the page is written, for relative links to the repository's files."""
    where = where or {}
    root = root or Path(".")
    page_dir = page_dir or root
    suite = str(result.get("suite") or Path(str(result.get("suite_file") or "gate")).stem)
    gate = where.get("gate") or f"gate {suite}"
    artifact = (result.get("artifact") or {}).get("path")
    checks = [e for e in result.get("expectations") or [] if isinstance(e, dict)]
    failed = [(i, e) for i, e in enumerate(checks) if not e.get("success")]
    parts = ["<!doctype html><html lang=en><head><meta charset=utf-8>",
             f"<title>{html.escape(gate)}: {'no verdict' if result.get('error') else 'FAIL' if failed else 'pass'}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>{html.escape(gate)}</h1>"]
    meta = result.get("meta") or {}
    why = meta.get("why")
    docs = meta.get("docs") if isinstance(meta.get("docs"), str) else None
    read = (f'<a class=docs href="{html.escape(_link(docs, page_dir, root))}">{html.escape(docs)}</a>'
            if docs else "")
    if artifact:
        parts.append(f"<p class=muted>checks <code>{html.escape(artifact)}</code>"
                     + (f" ({_n(result['rows'])} rows)" if isinstance(result.get("rows"), int) else "")
                     + f" against <code>{html.escape(str(result.get('suite_file') or suite))}</code></p>")
    if why:
        parts.append(f"<p class=note>{html.escape(why)}</p>")
    rerun = f"dvc repro {where['gate']}" if where.get("gate") else "dvc repro"
    fix = _fix(where, artifact, rerun, page_dir, root)
    if read:
        # Where the user stands when a gate fails: the page that says why each check exists and
        # what usually fixes it (the suite's meta.docs).
        fix += f"<br><strong>Why, and the usual fixes:</strong> {read}."
    if result.get("error"):
        parts.append(f'<div class="banner none"><strong>No verdict.</strong> The gate could not judge: '
                     f"{html.escape(str(result['error']))}<br>{fix}</div>")
    elif failed:
        i0, e0 = failed[0]
        parts.append(f'<div class="banner fail"><strong>FAILED: {len(failed)} of {len(checks)} checks.</strong> '
                     f'Start with <a href="#check-{i0}">{html.escape(title(e0))}</a>: the first failure in the '
                     "pipeline's order; the ones after it may follow from it.<br>" + fix + "</div>")
    else:
        parts.append(f'<div class="banner pass"><strong>PASSED: all {len(checks)} checks.</strong>'
                     + (f" What they check and why: {read}." if read else "") + "</div>")
    if failed:
        parts.append("<h2>Failed checks, root first</h2>")
        for k, (i, e) in enumerate(failed):
            parts.append(_failure(i, e, k == 0, failed[0][0], artifact))
    passed = [(i, e) for i, e in enumerate(checks) if e.get("success")]
    if passed:
        parts.append(f"<h2>Passed checks ({len(passed)})</h2><div class=scroll><table>"
                     "<tr><th>#</th><th>check</th><th>observed</th><th>allowed</th></tr>")
        for i, e in passed:
            obs = (f"{_n(e.get('unexpected_count', 0))} of {_n(e.get('element_count'))} rows unexpected"
                   if "unexpected_count" in e and e.get("observed_value") is None else _n(e.get("observed_value")))
            parts.append(f'<tr id="check-{i}"><td>{i}</td><td>{html.escape(title(e))}</td>'
                         f"<td>{html.escape(obs)}</td><td>{html.escape(expected(e))}</td></tr>")
        parts.append("</table></div>")
    parts += _computed_tables(result, record)
    facts = [f"record: <code>{html.escape(record)}</code>" if record else "",
             f"suite sha256 <code>{html.escape(str(result.get('suite_sha256'))[:12])}</code>" if result.get("suite_sha256") else "",
             f"artifact sha256 <code>{html.escape(str((result.get('artifact') or {}).get('sha256'))[:12])}</code>"
             if (result.get("artifact") or {}).get("sha256") else ""]
    parts.append("<p class=muted>" + " · ".join(f for f in facts if f) + "</p></body></html>\n")
    return "".join(parts)


def _computed_tables(result: dict, record: str | None) -> list[str]:
    """The tables a gate's check put in its report (`computed.report.tables`: name -> {note, columns,
    rows}), each whole: what the gate recomputed, for a reviewer to read beside the verdict. Columns
    in `columns`' order: the record's rows have their keys sorted, the gate's in memory do not."""
    tables = ((result.get("computed") or {}).get("report") or {}).get("tables")
    out = []
    for name, table in (tables.items() if isinstance(tables, dict) else ()):
        rows = table.get("rows") if isinstance(table, dict) else None
        if not isinstance(rows, list):
            continue
        where = f" (<code>{html.escape(record)}</code>: computed.report.tables.{html.escape(name)})" if record else ""
        out.append(f'<h2 id="computed-{html.escape(name)}">Computed by the gate: {html.escape(name)}, '
                   f"{_n(len(rows))} rows</h2>")
        if table.get("note"):
            out.append(f'<p class="note">{html.escape(str(table["note"]))}{where}</p>')
        out.append(_rows_table(rows, [str(c) for c in table.get("columns") or []]))
    return out


def _fix(where: dict, artifact: str | None, rerun: str, page_dir: Path, root: Path) -> str:
    producer = where.get("producer")
    if producer and artifact:
        code = (f' (<a href="{html.escape(_link(where["producer_file"], page_dir, root))}">'
                f'{html.escape(where["producer_file"])}</a>)' if where.get("producer_file") else "")
        return (f"<strong>What to do:</strong> <code>{html.escape(artifact)}</code> was written by stage "
                f"<code>{html.escape(producer)}</code>{code}. Read the offending rows below, fix that stage, its "
                f"params or its inputs, then run <code>{html.escape(rerun)}</code>: DVC reruns "
                f"<code>{html.escape(producer)}</code> first when its code, params or inputs changed, or its output "
                "no longer matches dvc.lock.")
    return f"<strong>What to do:</strong> fix the artifact, then run <code>{html.escape(rerun)}</code>."


def _failure(i: int, e: dict, root_failure: bool, first: int, artifact: str | None) -> str:
    tag = ('<span class="tag root">root failure: start here</span>' if root_failure else
           f'<span class="tag after">may follow from #{first}</span>')
    meta = e.get("meta") or {}
    out = [f'<div class="check{" root" if root_failure else ""}" id="check-{i}">',
           f"<h3>#{i} {html.escape(title(e))}{tag}</h3>",
           f'<p class="what"><strong>{html.escape(observed(e))}</strong></p>']
    if meta.get("notes"):
        out.append(f'<p class="note"><strong>What it checks:</strong> {html.escape(str(meta["notes"]))}</p>')
    rows = e.get("offending_rows") or []
    if rows:
        where = f" of <code>{html.escape(artifact)}</code>" if artifact else ""
        out.append(f"<p><strong>Look at</strong> these rows{where} (the first {len(rows)}, with the evidence the "
                   "suite recomputed):</p>" + _rows_table(rows, list(e.get("offending_columns") or [])))
    elif e.get("unexpected_sample"):
        out.append("<p><strong>Look at</strong> these values: <code>"
                   + html.escape(", ".join(_cell(v) for v in e["unexpected_sample"])) + "</code></p>")
    out.append("</div>")
    return "".join(out)


def write(result: dict, site: str | Path, root: str | Path = ".", record: str | None = None,
          dvc_yaml: dict | None = None) -> Path:
    """Write the page of `result` beside the Data Docs `site`; returns its path. `dvc_yaml`: the
    pipeline (read from `root` when not given) that names the gate and the artifact's producer."""
    root = Path(root)
    suite = str(result.get("suite") or Path(str(result.get("suite_file") or "gate")).stem)
    path = page_path(site if Path(site).is_absolute() else root / site, suite)
    where = stages_of(dvc_yaml if dvc_yaml is not None else read_dvc_yaml(root),
                      (result.get("artifact") or {}).get("path"), record)
    write_text(path, render(result, where, record, path.parent, root))
    return path
