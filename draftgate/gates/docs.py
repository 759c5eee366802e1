"""The Data Docs site, offline: every page loads its CSS, scripts and images from the site itself.

GX 1.24's page templates link jQuery, Bootstrap 4, bootstrap-table, bootstrap-datepicker, Font
Awesome, popper and Vega from public CDNs, and its logo from an S3 bucket (with a timestamp in the
URL). Opened without network (the usual GPU cluster) a page has no styles and the index lists
nothing: bootstrap-table draws its tables from data in the page. assets/ holds those exact versions
(see assets/README.md; popper's and Bootstrap's files hash to the integrity values GX's templates
pin), localise() copies them to <site>/static/vendor/ and points every page at them by relative
path, so the site also works when moved or zipped as a whole.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

KEEP_RUNS = 10      # validation results kept per suite in the site (`draftgate validate --keep-runs`)
ASSETS = Path(__file__).with_name("assets")
VENDOR = ("static", "vendor")      # where the assets go inside the site

# GX's CDN URL -> the vendored file (under assets/ and <site>/static/vendor/).
CDN = {
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery-3.7.1/jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper.js-1.12.9/popper.min.js",
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap-4.3.1/bootstrap.min.css",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap-4.3.1/bootstrap.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": "bootstrap-table-1.19.1/bootstrap-table.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": "bootstrap-table-1.19.1/bootstrap-table.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js":
        "bootstrap-table-1.19.1/bootstrap-table-filter-control.min.js",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css":
        "bootstrap-table-1.19.0/bootstrap-table-filter-control.min.css",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css":
        "bootstrap-table-1.19.0/bootstrap-table-filter-control.css",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css":
        "bootstrap-datepicker-1.9.0/bootstrap-datepicker.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js":
        "bootstrap-datepicker-1.9.0/bootstrap-datepicker.min.js",
    # The same stylesheet, minified by its own package.
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css":
        "bootstrap-dark-1.1.0/bootstrap-prefers-dark.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": "fontawesome-free-6.6.0/css/all.min.css",
    # GX asks for the newest 5.x / 5.x / 6.x; these are the newest of each when vendored.
    "https://cdn.jsdelivr.net/npm/vega@5": "vega-5.33.1/vega.min.js",
    "https://cdn.jsdelivr.net/npm/vega-lite@5": "vega-lite-5.23.0/vega-lite.min.js",
    "https://cdn.jsdelivr.net/npm/vega-embed@6": "vega-embed-6.29.0/vega-embed.min.js",
}
_CDN_ATTR = re.compile(r'(?P<q>["\'])(?P<url>' + "|".join(map(re.escape, sorted(CDN, key=len, reverse=True)))
                       + r')(?P=q)')
# The logo GX links from its bucket, with a timestamp and the context's id in the query; its own
# static/images/ (copied into every site) has the light logo, which also stands in for the dark one.
_GX_BUCKET = re.compile(r"https://great-expectations-web-assets\.s3\.[a-z0-9-]+\.amazonaws\.com/"
                        r"(?P<name>[A-Za-z0-9_.-]+)(?:\?[^\"')\s]*)?")
GX_IMAGES = {"logo-long.png": "logo-long.png", "full_logo_dark.png": "logo-long.png"}
# A link into the site's static/ folder, at whatever depth GX guessed: its favicon link on a
# validation page climbs one folder too few (favicon.j2: `dot_count + 3`, the page is 4 deep).
_STATIC = re.compile(r"""(?P<q>["'])(?:\./|(?:\.\./)+)static/""")
# Integrity and CORS attributes only apply to the CDN copies: a browser refuses a crossorigin
# request for a file:// page's own files.
_CORS_ATTRS = re.compile(r'\s(?:integrity|crossorigin)=(["\'])[^"\']*\1')
_TAG = re.compile(r"<(?:script|link)\b[^>]*>", re.IGNORECASE)
# What would still reach the network: script/img src, link href (stylesheets, icons), CSS url() and @import.
_REMOTE = re.compile(r"""<(?:script|img)\b[^>]*\ssrc=["']?(?P<a>(?:https?:)?//[^"'\s>]+)"""
                     r"""|<link\b[^>]*\shref=["']?(?P<b>(?:https?:)?//[^"'\s>]+)"""
                     r"""|url\(\s*["']?(?P<c>(?:https?:)?//[^"')\s]+)"""
                     r"""|@import\s+(?:url\()?\s*["'](?P<d>(?:https?:)?//[^"']+)""", re.IGNORECASE)


def localise(site: Path) -> list[str]:
    """Copy the assets into `site` and point its pages and stylesheets at them.

    Returns the remote references left (URLs GX added that this module does not know), as
    "page: url" lines for the caller to print; tests/test_gates_docs.py requires none.
    """
    site = Path(site)
    install(site)
    left = []
    vendor = site.joinpath(*VENDOR)
    for path in [*site.rglob("*.html"), *site.joinpath("static", "styles").glob("*.css")]:
        if vendor in path.parents:
            continue
        text = path.read_text(encoding="utf-8")
        if not _fresh_from_gx(text):   # localised by an earlier gate: ~1 ms to tell, ~4 ms to redo
            continue
        local = rewrite(text, root=Path(os.path.relpath(site, path.parent)).as_posix())
        if local != text:
            path.write_text(local, encoding="utf-8")
        left += [f"{path}: {url}" for url in remote_references(local)]
    return left


def _fresh_from_gx(text: str) -> bool:
    """Whether GX (re)wrote this page or stylesheet since it was localised: it links a CDN, or has
    no vendored asset yet (a page of new templates whose links this module does not know)."""
    return any(url in text for url in CDN) or "amazonaws.com" in text or "/static/vendor/" not in text


def install(site: Path) -> None:
    """Copy assets/ to <site>/static/vendor/ (files missing there or of another size)."""
    target = Path(site).joinpath(*VENDOR)
    for src in ASSETS.rglob("*"):
        if src.is_file():
            dst = target / src.relative_to(ASSETS)
            if not dst.is_file() or dst.stat().st_size != src.stat().st_size:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)


def rewrite(text: str, root: str) -> str:
    """`text` (a page, or a stylesheet) with GX's remote assets replaced by paths from `root`,
    the relative path from the file's folder to the site's."""
    vendor = "/".join((root, *VENDOR))
    text = _CDN_ATTR.sub(lambda m: f"{m['q']}{vendor}/{CDN[m['url']]}{m['q']}", text)

    def bucket(m: re.Match) -> str:
        name = GX_IMAGES.get(m["name"])
        return f"{root}/static/images/{name}" if name else m[0]

    text = _GX_BUCKET.sub(bucket, text)
    text = _STATIC.sub(lambda m: f"{m['q']}{root}/static/", text)
    return _TAG.sub(lambda m: _CORS_ATTRS.sub("", m[0]) if f"{vendor}/" in m[0] else m[0], text)


def remote_references(text: str) -> list[str]:
    return [next(v for v in m.groups() if v) for m in _REMOTE.finditer(text)]


# ------------------------------------------------------------ each check explained on the validation page

# GX 1.24 shows an expectation's notes on the suite page only, and its documented hook for extra
# columns on the validation page (the suite's meta.notes naming `meta_properties_to_render`) breaks
# the page: it puts that key in each expectation's kwargs, which GX's own Expectation model then
# rejects ("extra fields not permitted"), and the page is not written. So the page GX wrote is
# annotated instead: each check's row gets its note and, when it failed, its offending rows.
# GX's markup: one section per column (its name in an <h5>, "Table-Level Expectations" for checks
# without one), the sections' checks in result order, and the Expectation cell of row R in section
# S is the <td> just before `section-S-content-block-2-cell-R-3` (the Observed Value cell).
TABLE_LEVEL = "Table-Level Expectations"
_SECTION = re.compile(r'id="section-(?P<s>\d+)-content-block-1-header"[^>]*>(?:(?!-content-block-1-header).)*?'
                      r'<h5\b[^>]*>(?P<name>.*?)</h5>', re.S)   # its own header's <h5>, never the next one's
_CODE = re.compile(r"`([^`]+)`")


def explain(page: str, checks: Sequence[tuple[Any, str | None, list[dict], list[str]]]) -> str:
    """`page` (a validation page GX rendered) with each check's note and offending rows under its
    Expectation cell. `checks`: (its `column` kwarg, note, offending rows, their columns in the
    order shown) per result, in the validation's order. A section whose rows do not match the checks (GX's markup changed) is left
    as it is; tests/test_gates_evidence_page.py opens the pages in Chromium."""
    by_name: dict[str, list] = {}
    for column, note, rows, header in checks:
        by_name.setdefault(column if isinstance(column, str) else TABLE_LEVEL, []).append((note, rows, header))
    inserts = []
    for m in _SECTION.finditer(page):
        name = html.unescape(re.sub(r"<[^>]+>", "", m["name"])).strip()
        mine = by_name.get(name)
        if not mine:
            continue
        cells = [page.find(f'<td id="section-{m["s"]}-content-block-2-cell-{r}-3"') for r in range(1, len(mine) + 2)]
        if -1 in cells[:-1] or cells[-1] != -1:
            continue     # not one row per check: leave the section as GX drew it
        for at, (note, rows, header) in zip(cells, mine):
            end = page.rfind("</div></td>", 0, at)
            block = annotation(note, rows, header)
            if end > 0 and block:
                inserts.append((end, block))
    for end, block in sorted(inserts, reverse=True):
        page = page[:end] + block + page[end:]
    return page


def annotation(note: str | None, rows: list[dict], header: Sequence[str] = ()) -> str:
    """The HTML under one check: what it means; for a failed one, its first rows and their evidence
    (the columns in `header`'s order, then any others)."""
    out = []
    if note:
        out.append('<p class="draftgate-note small text-muted mt-2 mb-1"><strong>What it checks:</strong> '
                   + _CODE.sub(r"<code>\1</code>", html.escape(note)) + "</p>")
    rows = [r for r in rows or [] if isinstance(r, dict)]
    if rows:
        header = list(dict.fromkeys([*header, *(k for r in rows for k in r)]))
        # The check's own column often repeats the key (a prompt id): shown once.
        shown: list[str] = []
        for k in header:
            if not any(all(isinstance(r.get(k), str) and r.get(k) == r.get(o) for r in rows) for o in shown):
                shown.append(k)
        pad = "padding:4px 8px"
        head = "".join(f'<th style="{pad}">{html.escape(str(k))}</th>' for k in shown)
        body = "".join("<tr>" + "".join(f'<td class="text-monospace" style="overflow-wrap:anywhere;{pad}">'
                                        f"{html.escape(_shown(r.get(k)))}</td>" for k in shown) + "</tr>" for r in rows)
        out.append(f'<div class="draftgate-evidence small mt-1"><strong>Offending rows</strong> (the first '
                   f'{len(rows)}, with the evidence the suite computed):<div class="table-responsive">'
                   f'<table class="table table-sm table-bordered mb-1"><thead><tr>{head}</tr></thead>'
                   f"<tbody>{body}</tbody></table></div></div>")
    return "".join(out)


def _shown(v: Any) -> str:
    if v is None:
        return "null"
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
