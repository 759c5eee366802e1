"""The data path at scale: wall time and peak RSS per stage at N and 10 x N synthetic prompts.

    .venv/bin/python -m bench.scale [--sizes 50000 500000] [--concurrency 2000]
    .venv/bin/python -m bench.scale --work /tmp/scale                 # keep the data there
    .venv/bin/python -m bench.scale --work /tmp/scale --stages gate_tokens generate_resume
                                    # rerun those stages on the kept data (both sizes)

Each size runs the real stages as DVC runs them (`python -m stages.X`, `draftgate validate`), one
process each under /usr/bin/time, in a throwaway directory: prompts -> gate_prompts -> generate
(against the canned scripted server on loopback, which answers at once) -> generate again (the
no-op resume) -> gate_responses -> reconstruct -> gate_tokens. The baseline is the smaller size in
the same run. Targets (hardening issue): at 10 x the rows, peak RSS <= 1.5 x and wall <= 11 x per
stage; the no-op resume of the larger size <= 10 s. Writes bench/results/scale.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
STAGES = ("prompts", "gate_prompts", "generate", "generate_resume", "gate_responses", "reconstruct", "gate_tokens")


def synthetic_prompts(path: Path, n: int) -> None:
    # Distinct short chat prompts (~90 bytes each), one per line, written in blocks.
    with open(path, "w", encoding="utf-8") as f:
        block = []
        for i in range(n):
            block.append(json.dumps({"messages": [{"role": "user", "content":
                                     f"Question {i}: what is {i} plus {i * 7 % 13}? Answer briefly."}]}) + "\n")
            if len(block) == 10_000:
                f.writelines(block)
                block = []
        f.writelines(block)


def params(url: str, concurrency: int) -> dict:
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["prompts"].update(datasets=["synth"], heldout_fraction=0.1, max_prompts=None)
    # The canned answer carries reasoning: a thinking template renders it (chatml has no think
    # block and would quarantine every row, measuring nothing of the reconstruction).
    p["tokenizer"].update(kind="qwen3", path=None, expected_ids={})
    p["template"].update(name="qwen3", thinking=True)
    p["generate"].update(backend="openai", base_url=url, model="canned", concurrency=concurrency,
                         max_tokens=16, max_attempts=2, timeout_s=120.0, limit=None)
    # The canned server returns no ids: a text-only backend, whose billing convention is declared.
    p["reconstruct"]["billing"] = {"completion": {"*": "counts_end"}, "prompt": {"*": 0}}
    # Thresholds are not what this measures: every stage must run to the end.
    p["gates"]["responses"].update(max_length_rate=1.0, max_failed_rate=1.0)
    p["gates"]["tokens"].update(max_billing_delta_rate=1.0, min_row_billing_agreement=0.0,
                                max_prompt_billing_delta_rate=1.0, min_prompt_billing_agreement=0.0,
                                max_mismatch_rate=1.0, max_quarantine_rate=1.0)
    return p


def timed(cmd: list[str], env: dict) -> dict:
    """Wall seconds and peak RSS (MB) of one process, as /usr/bin/time sees them."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.perf_counter()
        out = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf.name, *cmd], cwd=REPO, env=env,
                             capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rss_kb = int(tf.read().strip().splitlines()[-1])
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(rss_kb / 1024, 1), "rc": out.returncode,
            "tail": (out.stdout + out.stderr)[-400:] if out.returncode not in (0,) else ""}


def run_size(n: int, url: str, concurrency: int, work: Path, stages: tuple[str, ...] = STAGES) -> dict:
    d = work / f"n{n}"
    fresh = not (d / "raw" / "synth.jsonl").is_file()
    if fresh:
        (d / "raw").mkdir(parents=True, exist_ok=True)
        synthetic_prompts(d / "raw" / "synth.jsonl", n)
    (d / "params.yaml").write_text(yaml.safe_dump(params(url, concurrency), sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    P = str(d / "params.yaml")
    validate = [PY, "-m", "draftgate.cli", "validate"]
    subprocess.run([PY, "-m", "stages.contract", "--params", P, "--out", str(d / "contract.json"),
                    "--vocab", str(d / "vocab.parquet")], cwd=REPO, env=env, check=True, capture_output=True)
    cmds = {
        "prompts": [PY, "-m", "stages.prompts", "--params", P, "--raw", str(d / "raw"), "--out", str(d / "prompts"),
                    "--metrics", str(d / "m_prompts.json")],
        "gate_prompts": validate + ["expectations/prompts.json", str(d / "prompts" / "prompts.parquet"),
                                    "--input", f"rejects={d / 'prompts' / 'rejects.parquet'}",
                                    "--result", str(d / "g_prompts.json"), "--params", P, "--no-docs"],
        "generate": [PY, "-m", "stages.generate", "--params", P, "--prompts", str(d / "prompts" / "prompts.parquet"),
                     "--gate", str(d / "g_prompts.json"), "--out", str(d / "responses"),
                     "--metrics", str(d / "m_generate.json")],
        "gate_responses": validate + ["expectations/responses.json", str(d / "responses" / "responses.parquet"),
                                      "--input", f"prompts={d / 'prompts' / 'prompts.parquet'}",
                                      "--result", str(d / "g_responses.json"), "--params", P, "--no-docs"],
        "reconstruct": [PY, "-m", "stages.reconstruct", "--params", P, "--contract", str(d / "contract.json"),
                        "--prompts", str(d / "prompts" / "prompts.parquet"),
                        "--responses", str(d / "responses" / "responses.parquet"),
                        "--gate", str(d / "g_responses.json"), "--out", str(d / "tokens"),
                        "--metrics", str(d / "m_reconstruct.json"), "--report", str(d / "mismatch.json"),
                        "--plot", str(d / "mismatch.csv")],
        "gate_tokens": validate + ["expectations/tokens.json", str(d / "tokens" / "tokens.parquet"),
                                   "--input", f"responses={d / 'responses' / 'responses.parquet'}",
                                   "--input", f"contract={d / 'contract.json'}",
                                   "--input", f"vocab={d / 'vocab.parquet'}",
                                   "--input", f"prompts={d / 'prompts' / 'prompts.parquet'}",
                                   "--result", str(d / "g_tokens.json"), "--params", P, "--no-docs"],
    }
    cmds["generate_resume"] = cmds["generate"]
    out = {}
    for stage in stages:
        r = out[stage] = timed(cmds[stage], env)
        print(f"  n={n:>7} {stage:<16} {r['wall_s']:>8.2f} s {r['peak_rss_mb']:>8.1f} MB rc={r['rc']}",
              file=sys.stderr)
        if r["rc"] not in (0, 1):      # 1: a gate that failed still ran to the end
            raise SystemExit(f"{stage} failed at n={n}:\n{r['tail']}")
        if stage == "reconstruct":    # what was measured must be the reconstruction, not quarantine
            kept = json.loads((d / "m_reconstruct.json").read_text())["rows_out"]
            if kept < 0.99 * n:
                raise SystemExit(f"reconstruct kept {kept} of {n} rows at n={n}: {d / 'm_reconstruct.details.json'}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs=2, default=(50_000, 500_000))
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "scale.json"))
    p.add_argument("--work", help="keep the data in this directory (default: a throwaway one); "
                                  "with --stages, rerun on the data a previous run kept there")
    p.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES),
                   help="run only these stages (their inputs must be in --work already); "
                        "a partial run prints its table but does not write --out")
    a = p.parse_args(argv)
    stages = tuple(s for s in STAGES if s in a.stages)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([PY, "-m", "draftgate.serve.scripted", "--canned", "--delay", "0", "0"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        with contextlib.ExitStack() as stack:
            tmp = a.work or stack.enter_context(tempfile.TemporaryDirectory(prefix="draftgate-scale-"))
            results = {n: run_size(n, url, a.concurrency, Path(tmp), stages) for n in a.sizes}
    finally:
        server.terminate()
        server.wait()
    small, big = a.sizes
    ratios = {s: {"rss": round(results[big][s]["peak_rss_mb"] / results[small][s]["peak_rss_mb"], 2),
                  "wall": round(results[big][s]["wall_s"] / max(results[small][s]["wall_s"], 1e-9), 2)}
              for s in stages}
    factor = big / small
    met = {s: {"rss": r["rss"] <= 1.5, "wall": r["wall"] <= 1.1 * factor} for s, r in ratios.items()}
    if "generate_resume" in stages:
        met["resume_s"] = results[big]["generate_resume"]["wall_s"] <= 10.0
    print(f"\n{'stage':<16}{'wall ' + str(small):>12}{'wall ' + str(big):>14}{'x':>7}"
          f"{'RSS MB ' + str(small):>16}{'RSS MB ' + str(big):>18}{'x':>7}")
    for s in stages:
        a_, b_ = results[small][s], results[big][s]
        print(f"{s:<16}{a_['wall_s']:>12}{b_['wall_s']:>14}{ratios[s]['wall']:>7}"
              f"{a_['peak_rss_mb']:>16}{b_['peak_rss_mb']:>18}{ratios[s]['rss']:>7}")
    print(f"\ntargets met: {met}")
    if stages != STAGES:
        return 0
    from draftgate.io import write_json

    write_json(a.out, {"sizes": list(a.sizes), "cpus": os.cpu_count(), "results": results, "ratios": ratios,
                       "targets_met": met})
    from bench.targets import verdict

    return verdict("scale", met)


if __name__ == "__main__":
    sys.exit(main())
