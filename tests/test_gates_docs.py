"""The Data Docs site: renders with no network, keeps the newest runs of each suite only."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from browser import dump_dom
from draftgate.gates import docs
from draftgate.gates import validate as gates

NOTE = "Every row names its prompt: the joins below are on `prompt_id`."
TOKENS = {"name": "tokens", "expectations": [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "prompt_id"}, "meta": {"notes": NOTE}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "match", "value_set": ["exact"]}},
    {"type": "expect_column_value_fraction_between", "kwargs": {"column": "match", "value": "exact", "min_value": 0.5}},
    {"type": "expect_column_mean_to_be_between", "kwargs": {"column": "n", "min_value": 0, "max_value": 10}}]}
PROMPTS = {"name": "prompts", "expectations": [
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}}]}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Two suites and their tables; the gates run from here as under `dvc repro`."""
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"prompt_id": ["a", "b", "c"], "match": ["exact", "exact", "bpe_only"], "n": [1, 2, 3]}),
                   tmp_path / "tokens.parquet")
    (tmp_path / "tokens.json").write_text(json.dumps(TOKENS))
    (tmp_path / "prompts.json").write_text(json.dumps(PROMPTS))
    return tmp_path


def gate(suite: str, *extra: str) -> int:
    return gates.main([suite, "tokens.parquet", "--docs", "site", *extra])


# ------------------------------------------------------------ offline

class References(HTMLParser):
    """Every URL a page makes the browser load: scripts, stylesheets, icons, images, CSS url()/@import."""

    LOADS = {"script": "src", "img": "src", "link": "href", "iframe": "src", "source": "src", "embed": "src"}

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []
        self._style = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get(self.LOADS.get(tag, "")):
            self.urls.append(attrs[self.LOADS[tag]])
        self.urls += css_urls(attrs.get("style") or "")
        self._style = tag == "style"

    def handle_endtag(self, tag):
        self._style = False

    def handle_data(self, data):
        if self._style:
            self.urls += css_urls(data)


def css_urls(css: str) -> list[str]:
    return re.findall(r"""url\(\s*["']?([^"')\s]+)""", css) + re.findall(r"""@import\s+["']([^"']+)""", css)


def remote(url: str) -> bool:
    return url.startswith("//") or urlsplit(url).scheme in ("http", "https", "ftp")


def test_no_data_docs_page_or_stylesheet_loads_anything_from_the_network(workdir):
    assert gate("tokens.json") == 1          # a failed check renders samples and a red status too
    assert gate("prompts.json") == 0
    site = workdir / "site"
    pages = sorted(site.rglob("*.html"))
    assert {p.relative_to(site).parts[0] for p in pages} == {"index.html", "expectations", "validations"}

    found, missing = [], []
    for page in pages:
        parser = References()
        parser.feed(page.read_text(encoding="utf-8"))
        assert len(parser.urls) >= 16, page   # GX's 16 script and stylesheet links, and images
        for url in parser.urls:
            if remote(url):
                found.append(f"{page.relative_to(site)}: {url}")
            elif not url.startswith(("data:", "#")) and not (page.parent / urlsplit(url).path).is_file():
                missing.append(f"{page.relative_to(site)}: {url}")
    for css in site.joinpath("static").rglob("*.css"):
        found += [f"{css.relative_to(site)}: {url}" for url in css_urls(css.read_text(encoding="utf-8"))
                  if remote(url)]
    assert found == []
    assert missing == []          # every local script, stylesheet and image is in the site


def test_the_vendored_files_are_the_ones_gxs_templates_link_and_pin():
    import great_expectations

    templates = Path(great_expectations.__file__).parent / "render" / "view" / "templates"
    text = "\n".join(t.read_text() for t in sorted(templates.glob("*.j2")))
    linked = set(re.findall(r"""<(?:script|link)\b[^>]*?(?:src|href)=["'](https?://[^"']+)""", text))
    assert linked == set(docs.CDN)       # a GX upgrade that links another file fails here
    pinned = re.findall(r"""src=["'](https?://[^"']+)["'][^>]*integrity=["']sha384-([^"']+)""", text)
    assert len(pinned) == 2
    for url, digest in pinned:
        body = (docs.ASSETS / docs.CDN[url]).read_bytes()
        assert base64.b64encode(hashlib.sha384(body).digest()).decode() == digest, url


def test_rewriting_a_page_points_every_cdn_link_at_the_site_and_drops_cors_attributes():
    page = ('<script src="https://code.jquery.com/jquery-3.7.1.min.js"></script>\n'
            '<script src="https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js" '
            'integrity="sha384-x" crossorigin="anonymous"></script>\n'
            '<img src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=2026&x=1"/>\n'
            '<a href="https://greatexpectations.io">a link, not a load</a>')

    local = docs.rewrite(page, root="../..")

    assert local == ('<script src="../../static/vendor/jquery-3.7.1/jquery.min.js"></script>\n'
                     '<script src="../../static/vendor/bootstrap-4.3.1/bootstrap.min.js"></script>\n'
                     '<img src="../../static/images/logo-long.png"/>\n'
                     '<a href="https://greatexpectations.io">a link, not a load</a>')
    assert docs.remote_references(local) == [] and docs.rewrite(local, root="../..") == local


def test_a_browser_with_no_network_lists_every_validation_and_shows_each_checks_note(workdir, tmp_path):
    for _ in range(2):
        gate("tokens.json")
    gate("prompts.json")
    site = workdir / "site"

    index = dump_dom(site / "index.html", tmp_path / "profile")
    suite = dump_dom(site / "expectations" / "tokens.html", tmp_path / "profile")

    # bootstrap-table draws one clickable row per validation from data in the page: no script, no rows.
    rows = re.findall(r'<tr class="clickable-row" data-href="(validations/[^"]+)"', index)
    assert len(rows) == 3 and {r.split("/")[1] for r in rows} == {"tokens", "prompts"}
    assert all((site / r).is_file() for r in rows)
    # The suite page renders the note as markdown, in the expectation's collapsible notes block.
    assert "Every row names its prompt: the joins below are on <code>prompt_id</code>." in suite
    for dom in (index, suite):       # nothing the scripts added reaches out either
        parser = References()
        parser.feed(dom)
        assert [u for u in parser.urls if remote(u)] == []


# ------------------------------------------------------------ pruning

def test_only_the_newest_runs_of_each_suite_stay_in_the_site_and_its_stores(workdir, capsys):
    pages = []
    for _ in range(4):
        gate("tokens.json", "--keep-runs", "2")
        pages.append(re.search(r"data docs: file://(\S+)", capsys.readouterr().out)[1])
    gate("prompts.json", "--keep-runs", "2")
    site = workdir / "site"

    kept = sorted(p.relative_to(site / "validations").parts[:3] for p in (site / "validations").rglob("*.html"))
    stored = sorted(p.relative_to(site / ".gx" / "validations").parts[:3]
                    for p in (site / ".gx" / "validations").rglob("*.json"))
    assert kept == stored and len(kept) == 3       # 2 of tokens' 4 runs, prompts' 1
    assert [Path(p).is_file() for p in pages] == [False, False, True, True]
    index = (site / "index.html").read_text()
    assert [Path(p).relative_to(site).as_posix() in index for p in pages] == [False, False, True, True]
    assert not [d for d in (site / "validations").rglob("*") if d.is_dir() and not any(d.iterdir())]


def test_a_keep_runs_below_one_is_no_verdict(workdir, capsys):
    assert gate("tokens.json", "--keep-runs", "0") == 2
    assert "--keep-runs 0: keep at least 1 run" in capsys.readouterr().err


@pytest.mark.slow
def test_a_built_wheel_carries_every_vendored_asset(tmp_path):
    # A non-editable install (pip install ., a wheel on a cluster) has only what the wheel holds:
    # without the package-data entry in pyproject.toml the assets stay behind and pages go blank.
    import sys
    import zipfile

    repo = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    shutil.copytree(repo / "draftgate", src / "draftgate", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    "build_meta.build_wheel(sys.argv[1])", str(tmp_path / "dist")],
                   cwd=src, check=True, capture_output=True)
    [wheel] = (tmp_path / "dist").glob("draftgate-*.whl")
    assets = repo / "draftgate" / "gates" / "assets"

    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"draftgate/{f.relative_to(repo / 'draftgate').as_posix()}" for f in assets.rglob("*") if f.is_file()}
    assert len(expected) > 20 and expected <= names
