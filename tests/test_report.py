"""`draftgate report`: one static page that reads offline; rendered in headless Chromium where installed,
and every link checked to resolve to a file either way."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from browser import dump_dom
from dvc_repo import Repo, history_copy
from draftgate.lineage import report


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str, str]] = []     # (tag, attribute, value)

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.links.append((tag, name, value))


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Repo, Path]:
    repo = history_copy(tmp_path_factory, "report")
    docs = repo.root / "reports" / "data_docs" / "index.html"   # what the gate stages write
    docs.parent.mkdir(parents=True)
    docs.write_text("<html><body>Data Docs</body></html>\n")
    assert report.main(["--repo", str(repo.root)]) == 0
    return repo, repo.root / "reports" / "index.html"


def test_every_link_resolves_to_a_file_and_nothing_loads_from_the_network(page):
    repo, index = page
    html = index.read_text(encoding="utf-8")
    parser = Links()
    parser.feed(html)
    targets = {v for _, _, v in parser.links}
    assert {"data_docs/index.html", "../plots/mismatch.csv", "../plots/loss.csv", "audit.csv", "audit.duckdb"} <= targets
    for tag, attr, value in parser.links:
        assert not re.match(r"^[a-z][a-z0-9+.-]*:", value), f"<{tag} {attr}={value!r}> is not a relative file"
        assert (index.parent / value).is_file(), f"<{tag} {attr}={value!r}> does not resolve to a file"
    assert "<script" not in html and "@import" not in html and "url(" not in html


def test_each_declared_plot_is_an_inline_svg_and_the_audit_lists_every_revision(page):
    repo, index = page
    html = index.read_text(encoding="utf-8")
    assert html.count("<svg") == 2                             # plots/mismatch.csv and plots/loss.csv
    assert "mark-line" in html and "mark-rect" in html         # loss by step: a line; mismatch by dataset: bars
    for run in ("seed3", "workspace", repo.run("git", "rev-parse", "--short=8", "HEAD").stdout.strip()):
        assert f"<td>{run}</td>" in html
    assert "gate_tokens" in html and "data/drafter" in html   # gate verdicts; the final artifact's lineage


def test_headless_chromium_renders_the_page_and_the_data_docs_rebuilt_from_the_records(page, tmp_path):
    repo, index = page
    dom = dump_dom(index, tmp_path, budget_ms=2000)
    assert "<h1>draftgate report</h1>" in dom
    assert dom.count("<svg") == 2 and "seed3" in dom

    # The gates wrote no page in this checkout (the fixture's site had none): the report stage
    # rebuilt the site and each gate's own page from data/gates/tokens.details.json, and the pages
    # tell the same story.
    gates = re.findall(r'<tr id="gate-(gate_\w+)"><td><a href="(gates/[^"]+)">gate_\w+</a></td>'
                       r'<td><span class="(pass|fail)">[^<]+</span></td><td>([^<]+)</td>.*?'
                       r'<a href="(data_docs/validations/[^"]+)">page</a>', dom)
    site = dump_dom(index.parent / "data_docs" / "index.html", tmp_path, budget_ms=5000)
    listed = re.findall(r'<tr class="clickable-row" data-href="(validations/[^"]+)".*?</tr>', site, re.S)
    assert [g[0] for g in gates] == ["gate_tokens"] and len(listed) == 1
    gate, own, verdict, recorded, href = gates[0]
    assert href == "data_docs/" + listed[0] and (index.parent / href).is_file()
    assert own == "gates/tokens.html" and "PASSED: all 2 checks" in (index.parent / own).read_text()
    row = re.search(r'data-href="' + re.escape(listed[0]) + r'".*?</tr>', site, re.S)[0]
    when, commit = re.fullmatch(r"(.+) UTC \((\w+)\)", recorded).groups()
    assert when in row and commit in row and gate in row
    assert ("text-success" in row) == (verdict == "pass")
    assert "All 1 gates pass." in dom


def test_a_categorical_x_draws_bars_with_their_values_and_a_numeric_x_draws_a_line():
    bars = report.vega_spec({"path": "m.csv", "x": "dataset", "y": "rate"},
                            ["dataset", "rate"], [{"dataset": "chat", "rate": "0.05"}, {"dataset": "code", "rate": "0.15"}])
    assert [layer["mark"]["type"] for layer in bars["layer"]] == ["bar", "text"]
    svg = report.render_svg(bars)
    assert svg.count('class="mark-rect') == 1 and ">0.05<" in svg and ">0.15<" in svg
    line = report.vega_spec({"path": "loss.csv", "x": "step", "y": "loss"}, ["step", "loss"],
                            [{"step": str(s), "loss": str(1 / (s + 1))} for s in range(4)])
    assert line["layer"][0]["mark"]["type"] == "line" and line["layer"][0]["encoding"]["x"]["type"] == "quantitative"
    assert report.vega_spec({"path": "e.csv", "x": "x", "y": "y"}, ["x", "y"], []) is None


def test_a_long_table_draws_one_line_per_series_with_a_legend():
    # plots/eval_per_position.csv: one row per (position, setting); drawn once as one zigzag line.
    rows = [{"position": str(p), "setting": s, "acceptance_rate": str(r)}
            for s, rates in (("eagle3", (0.19, 0.03)), ("ngram", (0.86, 0.76))) for p, r in zip((1, 2), rates)]
    spec = report.vega_spec({"path": "e.csv", "x": "position", "y": "acceptance_rate"},
                            ["position", "setting", "acceptance_rate"], rows)
    assert spec["layer"][0]["encoding"]["color"]["field"] == "setting"
    svg = report.render_svg(spec)
    assert svg.count('class="mark-line') == 2                                  # a line per series
    assert ">eagle3<" in svg and ">ngram<" in svg                                # the legend
    assert ">1.5<" not in svg                                                  # integer positions: integer ticks


def test_plot_columns_follow_dvc_yaml_or_default_to_every_numeric_column():
    rows = [{"step": "0", "loss": "1.0", "name": "a"}]
    assert report.series_of({"x": "step", "y": "loss"}, ["step", "loss", "name"], rows) == ("step", ["loss"])
    assert report.series_of({"y": {"plots/x.csv": ["loss"]}}, ["step", "loss"], rows) == (None, ["loss"])
    assert report.series_of({}, ["step", "loss", "name"], rows) == (None, ["step", "loss"])


def test_the_report_stage_if_present_comes_after_every_gate_and_plot():
    import yaml

    stages = yaml.safe_load((Path(__file__).resolve().parents[1] / "dvc.yaml").read_text())["stages"]
    stage = next((s for s in stages.values() if report.REPORT_CMD.search(str(s.get("cmd", "")))), None)
    if stage is None:
        pytest.skip("dvc.yaml has no `draftgate report` stage yet")
    deps = {d if isinstance(d, str) else next(iter(d)) for d in stage.get("deps", [])}

    def paths(s: dict, key: str) -> list[str]:
        return [p if isinstance(p, str) else next(iter(p)) for p in s.get(key) or []]
    gates = {m for name, s in stages.items() if name.startswith("gate_") for m in paths(s, "metrics")}
    assert gates, "dvc.yaml has no gate stage (gate_*)"
    plots = {p for s in stages.values() for p in paths(s, "plots")}
    assert not gates - deps, f"the report stage should list every gate's metric among its deps: add {sorted(gates - deps)}"
    assert not plots - deps, f"the report stage should list every plot among its deps: add {sorted(plots - deps)}"


def test_the_page_traces_the_drafter_not_only_the_final_eval():
    # eval reads the drafter, so the drafter is no final artifact: the report stage names it.
    import yaml

    from draftgate.lineage.pipeline import Pipeline

    real = Pipeline(yaml.safe_load((Path(__file__).resolve().parents[1] / "dvc.yaml").read_text()), None)
    traced = report.traced_artifacts(real)
    assert "data/drafter" in traced and "data/eval" in traced
    assert all(not p.startswith("data/gates/") for p in traced)


def test_without_a_report_stage_the_page_traces_the_final_artifacts_open(page):
    repo, index = page
    html = index.read_text(encoding="utf-8")
    assert '<details open id="lineage-data-drafter"><summary>data/drafter</summary>' in html
    assert "md5 " in html and "written by stage train" in html


def test_json_plots_are_read_as_dvc_reads_them(tmp_path):
    curve = tmp_path / "loss.json"
    curve.write_text('[{"step": 0, "loss": 3.0}, {"step": 1, "loss": 2.0}]')
    assert report.read_plot(curve) == (["step", "loss"], [{"step": 0, "loss": 3.0}, {"step": 1, "loss": 2.0}])
    nested = tmp_path / "nested.json"
    nested.write_text('{"train": [{"step": 0, "acc": 0.5}]}')
    assert report.read_plot(nested) == (["step", "acc"], [{"step": 0, "acc": 0.5}])
    assert report.vega_spec({"path": "loss.json", "x": "step", "y": "loss"}, *report.read_plot(curve))["data"]["values"] == [
        {"step": 0.0, "loss": 3.0}, {"step": 1.0, "loss": 2.0}]


def test_a_gate_recorded_before_a_newer_upstream_record_is_stale_and_the_banner_says_where_it_stopped():
    import datetime as dt

    from draftgate.lineage import verdicts
    from draftgate.lineage.pipeline import Pipeline

    pipe = Pipeline({"stages": {
        "reconstruct": {"cmd": "python -m stages.reconstruct", "outs": ["data/tokens"]},
        "gate_tokens": {"cmd": "python -m stages.gate t data/tokens/t.parquet", "deps": ["data/tokens"],
                        "metrics": ["data/gates/tokens.json"]},
        "train": {"cmd": "python -m stages.train", "deps": ["data/tokens", "data/gates/tokens.json"],
                  "outs": ["data/drafter"]},
        "gate_drafter": {"cmd": "python -m stages.gate_drafter d data/drafter", "deps": ["data/drafter"],
                         "metrics": ["data/gates/drafter.json"]}}}, None)
    committed, now = dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 2)
    # The drill: gate_tokens reran on a corrupted table and failed; gate_drafter's record is the commit's.
    assert verdicts.stale(pipe, {"gate_tokens": now, "gate_drafter": committed}) == {"gate_drafter": "gate_tokens"}
    assert verdicts.stale(pipe, {"gate_tokens": committed, "gate_drafter": now}) == {}
    failed = {"success": False, "statistics": {"evaluated": 29, "unsuccessful": 4}, "expectations": []}
    text = verdicts.banner(["gate_tokens", "gate_drafter"], {"gate_tokens": failed, "gate_drafter": {"success": True}},
                           {"gate_drafter": "gate_tokens"}, {"gate_tokens": "gates/tokens.html"})
    assert 'Stopped at <a href="gates/tokens.html">gate_tokens</a></strong>: 4 of 29 checks failed' in text
    assert "1 gate(s) after it hold records of the data before this change" in text


def test_figures_stand_beside_what_their_checks_allow():
    from draftgate.lineage.verdicts import figures

    result = {"expectations": [
        {"type": "expect_column_max_to_be_between", "kwargs": {"column": "n_semantic", "max_value": 0},
         "success": False, "observed_value": 1},
        {"type": "expect_column_min_to_be_between", "kwargs": {"column": "billing_row_agreement", "min_value": 0.85},
         "success": True, "observed_value": 0.9067796610169492}]}
    assert figures(result) == "n_semantic 1 (at most 0) ✗; billing_row_agreement 0.9068 (at least 0.85)"


def test_a_plot_has_its_title_axis_names_with_units_and_a_caption_and_a_loss_axis_that_spans_the_data():
    plot = {"path": "plots/train_loss.json", "x": "step", "y": "loss", "stage": "train", "title": "Drafter training loss",
            "x_label": "optimizer step", "y_label": "loss (nats)"}
    spec = report.vega_spec(plot, ["step", "loss"], [{"step": s, "loss": 26.7 - s} for s in range(5)])
    enc = spec["layer"][0]["encoding"]
    assert spec["title"] == "Drafter training loss"
    assert (enc["x"]["title"], enc["y"]["title"], enc["y"]["scale"]) == ("optimizer step", "loss (nats)", {"zero": False})
    assert report.caption(plot) == "Drafter training loss: loss (nats) by optimizer step, written by stage train. Data:"
