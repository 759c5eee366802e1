"""Engine side of `hidden.backend: vllm`: run the rows' prefill through vLLM, one file per row.

    <engine python> -m draftgate.hidden.vllm_run JOB.json

Runs in the engine's environment (.venv-engine), started by draftgate/hidden/engine.py with only
the draftgate package on its path: it imports vLLM, torch and the standard library, never
draftgate's dependencies. JOB.json (written by the driver):

    {"model": DIR, "spool": DIR, "dtype": "float32", "layers": [2, 15, 27, 30],
     "max_model_len": 2048, "engine_args": {...},
     "groups": [{"name": "shard-00000", "rows": [{"name": "r000003", "ids": [...]}, ...]}, ...]}

`layers` are vLLM's ids (the state entering that decoder layer; the number of layers = the last
layer's output before the final norm). Each group (one planned shard) is one `LLM.generate` call
with a single output token per row; the connector (draftgate/hidden/vllm_connector.py) writes
`<spool>/<row name>.safetensors`, and once every row of the group is on disk this writes
`<spool>/<group name>.done` (atomically), the driver's signal to assemble that shard.
The engine never sees text: it starts without a tokenizer and takes the rows' ids as given.
"""

from __future__ import annotations

import json
import os
import sys
import time

FILE_WAIT_S = 120.0     # the connector writes a row one engine step after its output returns


def engine(job: dict):
    from vllm import LLM

    # Imported here first: a connector that cannot load fails now, with its own traceback, not
    # inside vLLM's engine process; vLLM then loads it again by module path.
    from draftgate.hidden.vllm_connector import SPOOL_PARAM, DraftgateHiddenStatesConnector as connector

    return LLM(
        model=job["model"], skip_tokenizer_init=True, dtype=job["dtype"],
        max_model_len=job["max_model_len"],
        # Prefill only: CUDA graphs capture decode batches and would buy nothing here; and on the
        # CPU build the compile cache never loads (~2 min per start, docs/engines.md).
        enforce_eager=True,
        # A cached prefix is not recomputed; its hidden-state slots then hold whatever request
        # shared the block. Every row is computed whole.
        enable_prefix_caching=False,
        speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                            "draft_model_config": {"hf_config": {
                                "eagle_aux_hidden_state_layer_ids": job["layers"]}}},
        kv_transfer_config={"kv_connector": connector.__name__, "kv_connector_module_path": connector.__module__,
                            "kv_role": "kv_producer",
                            "kv_connector_extra_config": {SPOOL_PARAM: job["spool"]}},
        **job.get("engine_args", {}),
    )


def run_group(llm, spool: str, group: dict) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from draftgate.hidden.vllm_connector import NAME_PARAM

    prompts = [TokensPrompt(prompt_token_ids=row["ids"]) for row in group["rows"]]
    sampling = [SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                               extra_args={"kv_transfer_params": {NAME_PARAM: row["name"]}})
                for row in group["rows"]]
    llm.generate(prompts, sampling, use_tqdm=False)
    paths = [os.path.join(spool, row["name"] + ".safetensors") for row in group["rows"]]
    deadline = time.monotonic() + FILE_WAIT_S
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            missing = [p for p in paths if not os.path.exists(p)]
            raise RuntimeError(f"{len(missing)} hidden-state files not written {FILE_WAIT_S:.0f} s after their "
                               f"requests finished, e.g. {missing[0]}: the connector failed (see the log above)")
        time.sleep(0.02)
    done = os.path.join(spool, group["name"] + ".done")
    with open(done + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"rows": len(paths)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(done + ".tmp", done)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m draftgate.hidden.vllm_run JOB.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        job = json.load(f)
    llm = engine(job)
    for group in job["groups"]:
        run_group(llm, job["spool"], group)
    return 0


if __name__ == "__main__":      # vLLM's engine process re-imports the main module: no work at import
    sys.exit(main())
