"""The report's gate section: one verdict for the whole pipeline, then each gate, stale ones marked.

Read from the gates' records (data/gates/<suite>.details.json, datadocs.read_records) in dvc.yaml's
order. A gate is stale when a gate upstream of it (pipeline.py's walk through dvc.yaml) holds a
newer record: after `dvc repro` stopped at a failed gate, the gates after it still hold the records
of the data before the change, and their "pass" is about that data, not this one. Every failure
links to its check on the gate's own page (draftgate/gates/page.py: reports/gates/<suite>.html#check-N).
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from draftgate.lineage.pipeline import Pipeline

FIGURES_SHOWN = 6
FAILURES_SHOWN = 5


def stale(pipe: Pipeline, times: dict[str, Any]) -> dict[str, str]:
    """{gate: the upstream gate with the newest record newer than its own} over the gates in `times`
    ({gate: record time})."""
    out = {}
    for gate, when in times.items():
        newer = [s.name for s in pipe.upstream(gate)
                 if s.is_gate and s.name != gate and s.name in times and times[s.name] > when]
        if newer:
            out[gate] = max(newer, key=lambda g: times[g])
    return out


def _state(result: dict | None) -> str:
    if result is None:
        return "not run"
    if result.get("error"):
        return "no verdict"
    return "pass" if result.get("success") else "FAIL"


def banner(order: list[str], results: dict[str, dict], stale_of: dict[str, str], link: dict[str, str]) -> str:
    """One sentence for the whole pipeline: all pass, or where it stopped and what that leaves stale."""
    def a(gate: str) -> str:
        return f'<a href="{html.escape(link[gate])}">{html.escape(gate)}</a>' if gate in link else html.escape(gate)

    stopped = [g for g in order if _state(results.get(g)) in ("FAIL", "no verdict")]
    missing = [g for g in order if g not in results]
    if stopped:
        g = stopped[0]
        r = results[g]
        why = (f"no verdict ({html.escape(str(r.get('error'))[:200])})" if r.get("error") else
               f"{(r.get('statistics') or {}).get('unsuccessful', '?')} of "
               f"{(r.get('statistics') or {}).get('evaluated', '?')} checks failed")
        after = [s for s in order if stale_of.get(s)]
        more = f"; {len(stopped) - 1} more gate(s) fail" if len(stopped) > 1 else ""
        return (f'<div class="banner fail"><strong>Stopped at {a(g)}</strong>: {why}{more}. '
                + (f"{len(after)} gate(s) after it hold records of the data before this change "
                   f"(marked stale below). " if after else "")
                + f"Start on {a(g)}'s page: the root failure is first.</div>")
    if missing:
        return (f'<div class="banner none"><strong>Incomplete</strong>: no record yet for '
                f"{', '.join(map(a, missing))} (run <code>dvc repro</code>).</div>")
    if stale_of:
        return (f'<div class="banner none"><strong>All {len(order)} gates passed</strong>, but '
                f"{', '.join(map(a, stale_of))} passed on older data than the gates before them: "
                "run <code>dvc repro</code>.</div>")
    return f'<div class="banner pass"><strong>All {len(order)} gates pass.</strong></div>'


def figures(result: dict) -> str:
    """Each figure a check observed, beside what it allows: failed ones first."""
    from draftgate.gates.page import expected

    shown = []
    checks = [e for e in result.get("expectations") or [] if isinstance(e, dict) and e.get("observed_value") is not None
              and not isinstance(e.get("observed_value"), (dict, list))]
    for e in sorted(checks, key=lambda e: bool(e.get("success"))):
        column = (e.get("kwargs") or {}).get("column") or "rows"
        v = e["observed_value"]
        value = f"{v:.4g}" if isinstance(v, float) else str(v)
        limit = expected(e)
        mark = "" if e.get("success") else " ✗"
        shown.append(f"{column} {value}" + (f" ({limit})" if limit else "") + mark)
    return "; ".join(shown[:FIGURES_SHOWN]) + (f"; … {len(shown) - FIGURES_SHOWN} more" if len(shown) > FIGURES_SHOWN else "")


def section(root: Path, page_dir: Path, site: Path, pipe: Pipeline, records: list[Any],
            docs_pages: dict[str, str]) -> str:
    """The Gates section: banner, table, failures. `site`: the Data Docs site (the gates' own pages
    sit beside it); `records`: datadocs.Record of each gate that has one; `docs_pages`: {gate: its
    Data Docs page, relative to root}."""
    from draftgate.gates.page import observed, page_path, title

    order = [st.name for st in pipe.stages.values() if st.is_gate]
    by_gate = {r.gate: r for r in records}
    results = {g: r.result for g, r in by_gate.items()}
    stale_of = stale(pipe, {g: r.run_time for g, r in by_gate.items()})

    def rel(p: Path) -> str:
        return Path(os.path.relpath(p, page_dir)).as_posix()

    link = {g: rel(page_path(site, r.suite)) for g, r in by_gate.items()}
    parts = [banner(order, results, stale_of, link),
             '<table class=gates><tr><th>gate</th><th>verdict</th><th>recorded</th><th>checks</th><th>rows</th>'
             "<th>figures (allowed)</th><th>Data Docs</th></tr>"]
    for g in order:
        r, rec = results.get(g), by_gate.get(g)
        state = _state(r)
        cls = {"pass": "pass", "FAIL": "fail", "no verdict": "fail"}.get(state, "muted")
        verdict = f'<span class="{cls}">{state}</span>'
        if g in stale_of:
            verdict += (f' <span class="stale" title="recorded before {html.escape(stale_of[g])}\'s newer record">'
                        f"stale: older than {html.escape(stale_of[g])}</span>")
        stats = (r or {}).get("statistics") or {}
        checks = f"{stats.get('successful', 0)}/{stats.get('evaluated')}" if stats.get("evaluated") is not None else ""
        name = f'<a href="{html.escape(link[g])}">{html.escape(g)}</a>' if g in link else html.escape(g)
        docs = (f'<a href="{html.escape(rel(root / docs_pages[g]))}">page</a>' if g in docs_pages else "")
        when = f"{rec.run_time:%Y-%m-%d %H:%M} UTC ({html.escape(rec.run_name)})" if rec else ""
        rows = f"{r['rows']:,}" if isinstance((r or {}).get("rows"), int) else ""
        parts.append(f'<tr id="gate-{html.escape(g)}"><td>{name}</td><td>{verdict}</td><td>{when}</td>'
                     f"<td>{checks}</td><td>{rows}</td><td class=figs>{html.escape(figures(r or {}))}</td>"
                     f"<td>{docs}</td></tr>")
    parts.append("</table>")
    failing = [g for g in order if _state(results.get(g)) in ("FAIL", "no verdict")]
    if failing:
        parts.append("<h3>Failures, root first</h3><ul class=failures>")
        for g in failing:
            r = results[g]
            if r.get("error"):
                parts.append(f'<li><a href="{html.escape(link[g])}">{html.escape(g)}</a>: no verdict: '
                             f"{html.escape(str(r['error'])[:300])}</li>")
                continue
            bad = [(i, e) for i, e in enumerate(r.get("expectations") or []) if not e.get("success")]
            for i, e in bad[:FAILURES_SHOWN]:
                parts.append(f'<li><a href="{html.escape(link[g])}#check-{i}">{html.escape(g)} #{i} '
                             f"{html.escape(title(e))}</a>: {html.escape(observed(e))}</li>")
            if len(bad) > FAILURES_SHOWN:
                parts.append(f'<li><a href="{html.escape(link[g])}">{html.escape(g)}</a>: '
                             f"{len(bad) - FAILURES_SHOWN} more on its page</li>")
        parts.append("</ul>")
    return "".join(parts)
