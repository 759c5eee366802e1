"""One vLLM request per row for repair's base pass AND the hidden stage's features: the check.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python -m bench.engine_shared_prefill [--rows 8]

The question docs/repair.md ("Engines: not shared yet") leaves open: can one engine pass per row
give both what `repair.backend: vllm` reads (the prompt's log-probabilities, VllmScorer) and what
`hidden.backend: vllm` reads (draftgate's KV connector's file, read_row)? The engine (.venv-engine)
runs its OpenAI server with the hidden backend's engine settings (vLLM's `extract_hidden_states`,
draftgate's connector, no prefix cache), and each row is ONE `/v1/completions` request: its ids,
`prompt_logprobs`, one generated token, and `kv_transfer_params` naming its file.

Rows: the first `--rows` kept rows of data/repair/tokens.parquet (the demo's, after `make repro`).
Both answers are checked against the in-process target on the same ids: every position's
log-probability (raw, temperature 1: HFScorer at T 1) and the features (float32, EAGLE-3's default layers:
the relative L2 error of each aux layer and of the final state), and the file must pass
read_row's proof (its ids are the row's, its layers the ones asked for). Targets: log-probability
differences <= 1e-3 nats and feature errors <= 1e-3 (the engine tests' bound). Seconds per request
are recorded, not judged (2 CPU cores). Writes bench/results/engine_shared_prefill.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.targets import verdict  # noqa: E402

TOKENS = ROOT / "data" / "repair" / "tokens.parquet"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine_shared_prefill.json"))
    args = ap.parse_args(argv)

    import httpx
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch

    from draftgate.config import HiddenParams
    from draftgate.engine.launch import running_vllm
    from draftgate.engine.model import SERVED_NAME, servable_dir
    from draftgate.engine.spool import NAME_PARAM, server_args, vllm_layers
    from draftgate.hidden.vllm_backend import read_row, row_name
    from draftgate.repair.score import HFScorer, Sampling
    from draftgate.target import capturing, load_target, resolve_layers

    if not TOKENS.exists():
        raise SystemExit(f"bench/engine_shared_prefill.py: {TOKENS} not found; run `make repro` first")
    table = pq.read_table(TOKENS, columns=["input_ids", "quarantine_reason"])
    kept = table.filter(pc.is_null(table.column("quarantine_reason"))).column("input_ids").to_pylist()[:args.rows]
    target = load_target(HiddenParams(), device="cpu")
    layers = resolve_layers(None, target.num_layers)
    ids_v = vllm_layers(layers, target.num_layers)
    scorer = HFScorer(target.model, Sampling(1.0, 1.0))
    rows, seconds = [], []
    with tempfile.TemporaryDirectory(prefix="draftgate-shared-prefill-") as tmp:
        spool = Path(tmp)
        with running_vllm(servable_dir().path, served_name=SERVED_NAME, extra_args=server_args(layers, target.num_layers, spool),
                          timeout_s=600) as engine:
            for i, ids in enumerate(kept):
                body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1,
                        "kv_transfer_params": {NAME_PARAM: row_name(i)}}
                start = time.perf_counter()
                answer = httpx.post(f"{engine.base_url}/completions", json=body, timeout=600)
                seconds.append(time.perf_counter() - start)
                answer.raise_for_status()
                engine_lp = [None if p is None else p[str(t)]["logprob"]
                             for p, t in zip(answer.json()["choices"][0]["prompt_logprobs"], ids)]
                rows.append((i, ids, engine_lp))
            deadline = time.monotonic() + 120        # the connector writes a row a step after its answer
            while not all((spool / f"{row_name(i)}.safetensors").exists() for i, _, _ in rows):
                if time.monotonic() > deadline:
                    raise SystemExit(f"the connector wrote no file for some rows in 120 s (log {engine.log_path})")
                time.sleep(0.05)
        import numpy as np

        figures = []
        for i, ids, engine_lp in rows:
            ours = scorer.score(ids, 1).logprobs
            lp_diff = max(abs(a - b) for a, b in zip(engine_lp[1:], ours))
            aux_v, final_v = read_row(spool, i, np.asarray(ids, dtype=np.int64), layers, target, "float32")
            decoder = target.model.get_decoder()
            with torch.inference_mode(), capturing(decoder, layers, 1, len(ids), torch.float32) as (aux, final):
                decoder(input_ids=torch.tensor([ids]))
            rel = [((aux_v[:, j] - aux[0, :, j]).norm() / aux[0, :, j].norm()).item() for j in range(len(layers))]
            rel.append(((final_v - final[0]).norm() / final[0].norm()).item())
            figures.append({"tokens": len(ids), "logprob_max_abs_diff": lp_diff, "feature_rel_l2": rel})
    worst_lp = max(f["logprob_max_abs_diff"] for f in figures)
    worst_rel = max(max(f["feature_rel_l2"]) for f in figures)
    out = {"rows": len(figures), "tokens": sum(f["tokens"] for f in figures),
           "logprob_max_abs_diff": worst_lp, "feature_rel_l2_max": worst_rel,
           "request_s": [round(s, 3) for s in seconds], "per_row": figures,
           "layers": list(layers), "vllm_layers": ids_v,
           "targets": {"logprobs_within_1e-3_nats": worst_lp <= 1e-3, "features_within_1e-3": worst_rel <= 1e-3},
           "load_average": os.getloadavg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "per_row"}, indent=1))
    return verdict("engine_shared_prefill", out["targets"])


if __name__ == "__main__":
    sys.exit(main())
