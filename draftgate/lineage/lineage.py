"""`draftgate lineage PATH`: which stages, data, params, templates, spend and gate verdicts made an artifact.

    draftgate lineage data/tokens/tokens.parquet            # a text tree, the workspace's dvc.lock
    draftgate lineage data/drafter --rev exp-a1b2c --json   # an experiment's (or a commit's) lineage

The chain is walked through the revision's dvc.lock (deps -> the stage that wrote them), so it is
what DVC recorded, not what the code would do today. docs/lineage.md shows an example.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from draftgate.lineage import facts
from draftgate.lineage.pipeline import Artifact, Pipeline, Stage
from draftgate.lineage.snapshot import WORKSPACE, RevisionError, Snapshot, dir_listing, open_revision, repo_root

FIGURES_SHOWN = 8


def is_code(root: Path, path: str) -> bool:
    """A dep that is code (a .py file, or a folder of a Python package) rather than data or a suite."""
    if path.endswith(".py"):
        return True
    first = path.split("/", 1)[0]
    return (root / first / "__init__.py").is_file() or (root / path / "__init__.py").is_file()


def _md5_file(path: Path) -> str | None:
    if not path.is_file():
        return None
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def artifact_md5(root: Path, pipe: Pipeline, path: str, out: Artifact, inner: str | None) -> str | None:
    """The artifact's own md5: the out's; a file's entry in its folder's .dir listing; a folder
    inside a folder out (data/drafter/sglang) as DVC hashes a folder, which is what a stage reading
    it records (eval's dep on data/drafter/sglang)."""
    if inner is None or not out.md5:
        return out.md5
    recorded = next((d.md5 for st in pipe.stages.values() for d in st.deps if d.path.rstrip("/") == path and d.md5),
                     None)
    listing = dir_listing(root, out.md5)
    if listing is None:         # the cache does not hold the folder's listing: only a reader's record is left
        return recorded
    entry = next((e for e in listing if e.get("relpath") == inner), None)
    if entry:
        return entry.get("md5")
    return folder_md5(listing, inner) or recorded


def folder_md5(listing: list[dict], inner: str) -> str | None:
    """DVC's hash of the folder `inner` of a cached folder: the md5 of its own sorted
    [{md5, relpath}] listing as compact-sorted JSON, plus `.dir` (dvc_data's Tree.digest)."""
    prefix = inner.rstrip("/") + "/"
    entries = sorted(({"md5": e["md5"], "relpath": e["relpath"][len(prefix):]} for e in listing
                      if e.get("relpath", "").startswith(prefix) and e.get("md5")), key=lambda e: e["relpath"])
    if not entries:
        return None
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest() + ".dir"


def revision_info(snap: Snapshot) -> dict:
    info = {"kind": snap.kind, "name": snap.name, "commit": snap.rev, "baseline": snap.baseline}
    if snap.kind == WORKSPACE:
        info["commit"] = snap.baseline
        status = subprocess.run(["git", "status", "--porcelain", "--", "dvc.lock", "params.yaml", "dvc.yaml"],
                                cwd=snap.root, capture_output=True, text=True).stdout
        info["uncommitted"] = sorted(line[3:] for line in status.splitlines())
    return info


def stage_record(snap: Snapshot, pipe: Pipeline, st: Stage) -> dict:
    deps = []
    for d in st.deps:
        producers = [p.name for p in pipe.producers_of_dep(d.path) if p.name != st.name]
        kind = "suite" if d.path.startswith("expectations/") else "code" if is_code(snap.root, d.path) else "data"
        deps.append({"path": d.path, "md5": d.md5, "from": producers[0] if producers else None,
                     "kind": "artifact" if producers else kind})
    rec: dict[str, Any] = {
        "stage": st.name, "ran": st.locked, "gate": st.is_gate, "cmd": st.cmd, "params": st.params, "deps": deps,
        "outs": [{"path": o.path, "md5": o.md5, "kind": o.kind} for o in st.outs],
        "figures": facts.stage_figures(snap, pipe, st), "fingerprints": facts.fingerprints(snap, pipe, st),
    }
    gen = facts.generation(snap, pipe, st)
    if gen:
        rec["generation"] = gen
    if st.is_gate:
        rec["verdict"] = facts.gate(snap, pipe, st)
    return rec


def lineage(path: str, root: str | Path | None = None, rev: str = WORKSPACE) -> dict:
    root = repo_root(root or ".")
    snap = open_revision(root, rev)
    pipe = Pipeline.at(snap)
    rel = _relative(root, path)
    found = pipe.producer(rel)
    if found is None:
        outs = sorted(o.path for st in pipe.stages.values() for o in st.data_outs)
        raise RevisionError(f"{rel}: no stage of dvc.yaml at {snap.name} writes it (or a folder holding it); "
                            f"artifacts: {', '.join(outs)}")
    st, out, inner = found
    chain = pipe.upstream(st.name)
    gates = pipe.gates_over(chain)
    records = [stage_record(snap, pipe, s) for s in reversed(chain)] + [stage_record(snap, pipe, g) for g in gates]
    fps: dict[str, str] = {}
    for r in records:
        fps.update(r["fingerprints"])
    md5 = artifact_md5(root, pipe, rel, out, inner)
    result: dict[str, Any] = {
        "artifact": rel, "md5": md5, "out": out.path if inner else None, "out_md5": out.md5 if inner else None,
        "stage": st.name, "revision": revision_info(snap), "identity": facts.identity(fps),
        "generation": next((r["generation"] for r in records if "generation" in r), None),
        "gates": [r["verdict"] for r in records if "verdict" in r],
        "stages": records,
    }
    if snap.kind == WORKSPACE and md5 and not md5.endswith(".dir"):
        result["workspace_matches_lock"] = _md5_file(root / rel) == md5
    snap.reader and snap.reader.close()
    return result


def _relative(root: Path, path: str) -> str:
    p = Path(path)
    if p.is_absolute():
        p = p.resolve().relative_to(root.resolve())
    else:
        full = (Path.cwd() / p).resolve()
        try:
            p = full.relative_to(root.resolve())
        except ValueError:
            pass
    return p.as_posix().rstrip("/")


# ------------------------------------------------------------ text

def short(h: str | None) -> str:
    if not h:
        return "-"
    return h[:8] + (".dir" if h.endswith(".dir") else "")


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def verdict_line(g: dict) -> str:
    if not g["ran"]:
        return "NOT RUN"
    if g.get("no_verdict"):
        return "NO VERDICT"
    word = "PASS" if g["success"] else "FAIL"
    counts = f" {g['checks'] - (g['failed'] or 0)}/{g['checks']}" if isinstance(g.get("checks"), int) else ""
    rows = f", {g['rows']:,} rows" if isinstance(g.get("rows"), int) else ""
    return f"{word}{counts}{rows}"


def render(result: dict) -> str:
    r = result["revision"]
    lines = [result["artifact"]]
    where = f" (in {result['out']} {short(result['out_md5'])})" if result["out"] else ""
    lines.append(f"  md5 {short(result['md5'])}{where}, written by stage {result['stage']}")
    rev = f"{r['name']}" + (f" on commit {r['commit'][:8]}" if r.get("commit") and r["kind"] != "commit" else
                             f" {r['commit'][:8]}" if r.get("commit") else "")
    if r.get("uncommitted"):
        rev += f" (uncommitted: {', '.join(r['uncommitted'])})"
    lines.append(f"  revision: {rev}")
    if "workspace_matches_lock" in result:
        lines.append("  on disk: " + ("matches dvc.lock" if result["workspace_matches_lock"]
                                      else "DIFFERS from dvc.lock (run `dvc status`)"))
    ident = result["identity"]
    lines.append("  identity: " + "  ".join(f"{k} {short(ident.get(k))}" for k in ("tokenizer", "template", "weights")))
    gen = result["generation"]
    if gen:
        providers = ", ".join(f"{k} {v}" for k, v in (gen["providers"] or {}).items()) or "-"
        lines.append(f"  generation: backend {gen['backend']}, model {gen['model']}, providers {providers}, "
                     f"spent ${fmt(gen['spent_usd'])}, wasted ${fmt(gen['wasted_usd'])}"
                     + (f" (journal total ${fmt(gen['journal_spent_usd'])})" if gen.get("journal_spent_usd") is not None else ""))
    gates = result["gates"]
    failed = [g["gate"] for g in gates if g["ran"] and not g["success"]]
    lines.append(f"  gates: {sum(1 for g in gates if g['ran'] and g['success'])} passed, {len(failed)} failed"
                 + (f" ({', '.join(failed)})" if failed else "")
                 + (f", {sum(1 for g in gates if not g['ran'])} not run" if any(not g["ran"] for g in gates) else ""))
    for i, rec in enumerate(result["stages"]):
        last = i == len(result["stages"]) - 1
        lines += _stage_lines(rec, "└── " if last else "├── ", "    " if last else "│   ")
    return "\n".join(lines)


def _stage_lines(rec: dict, head: str, pad: str) -> list[str]:
    title = rec["stage"] + ("" if rec["ran"] else "  (not in dvc.lock: never ran)")
    items: list[str] = []
    if "verdict" in rec:
        g = rec["verdict"]
        title += f"  {verdict_line(g)}"
        items.append(f"suite: {g['suite']} md5 {short(g['suite_md5'])}"
                     + (f" sha256 {short(g['suite_sha256'])}" if g.get("suite_sha256") else ""))
        if g["figures"]:
            items.append("figures: " + " · ".join(f"{k} {fmt(v)}" for k, v in g["figures"].items()))
        if g["unexpected"]:
            items.append("unexpected: " + " · ".join(f"{k} {fmt(v)}" for k, v in g["unexpected"].items()))
        items += [f"FAIL {f}" for f in g["failures"]]
    if rec["params"]:
        items.append("params: " + " · ".join(f"{k}={fmt(v)}" for k, v in rec["params"].items()))
    code = [d for d in rec["deps"] if d["kind"] == "code"]
    for d in rec["deps"]:
        if d["kind"] == "artifact":
            items.append(f"in: {d['path']} {short(d['md5'])} ← {d['from']}")
        elif d["kind"] == "data":
            items.append(f"in: {d['path']} {short(d['md5'])} (source)")
    if code:
        digest = hashlib.md5("".join(sorted(f"{d['path']}:{d['md5']}" for d in code)).encode()).hexdigest()
        items.append(f"code: {len(code)} deps, digest {digest[:8]}")
    for o in rec["outs"]:
        if o["kind"] != "metric" and not o["path"].endswith(".details.json"):
            items.append(f"out: {o['path']} {short(o['md5'])}" + (" (plot)" if o["kind"] == "plot" else ""))
    if "verdict" not in rec:
        for path, figs in rec["figures"].items():
            top = [(k, v) for k, v in figs.items() if "." not in k][:FIGURES_SHOWN]
            if top:
                items.append(f"figures ({path}): " + " · ".join(f"{k} {fmt(v)}" for k, v in top))
    for key, value in rec["fingerprints"].items():
        if "suite_sha256" not in key:
            items.append(f"fingerprint: {key} {short(value)}")
    out = [f"{head}{title}"]
    for j, item in enumerate(items):
        out.append(f"{pad}{'└── ' if j == len(items) - 1 else '├── '}{item}")
    return out


# ------------------------------------------------------------ CLI

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="draftgate lineage",
                                 description="The stages, data, params, fingerprints, spend and gate verdicts "
                                             "behind an artifact, from dvc.lock.")
    ap.add_argument("path", help="an artifact: a file or folder some stage of dvc.yaml writes (or a file inside one)")
    ap.add_argument("--rev", default=WORKSPACE,
                    help="workspace (default), a git revision (HEAD~1, a sha) or an experiment's name")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the text tree")
    ap.add_argument("--repo", default=".", help="the project's root (default: the current directory's repository)")
    args = ap.parse_args(argv)
    try:
        result = lineage(args.path, args.repo, args.rev)
    except RevisionError as e:
        print(f"draftgate lineage: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, sort_keys=False) if args.json else render(result))
    return 0
