"""DVC stage `generate`: prompts -> OpenAI-compatible API -> journal.jsonl -> responses.parquet.

python -m stages.generate --params params.yaml --prompts data/prompts/prompts.parquet \
    --gate data/gates/prompts.json --out data/responses --metrics metrics/generate.json

The journal (`--journal`, default `<out>/journal.jsonl`) is append-only and survives reruns:
finished prompts are skipped, so a crashed or stopped run resumes where it was.
`generate.budget_usd` bounds the whole journal, every run together (draftgate/client/budget.py).
With `backend: local` this stage starts the local server (draftgate.serve) for the run and passes
its identity (weights, tokenizer, template fingerprints) into every request hash; `backend: vllm`
does the same with the real vLLM (draftgate.engine; `make engine`), or uses one at base_url. The work is
draftgate/client/generate.py's; this file checks the gate, picks the target and writes the metrics.

Exit 0 when every prompt in scope was attempted or the budget ran out (the responses gate judges
completeness); 1 when the run stopped on 401 / credits (journal, table and metrics are still
written); 2 on unusable input or params.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stages.generate", description=__doc__.splitlines()[0])
    p.add_argument("--params", required=True, help="params.yaml (generate and serve sections)")
    p.add_argument("--prompts", required=True, help="prompts.parquet")
    p.add_argument("--gate", required=True, help="the prompts gate result; refuses to run unless success")
    p.add_argument("--out", required=True, help="directory for responses.parquet")
    p.add_argument("--journal", help="the append-only journal of paid answers (default: <out>/journal.jsonl); "
                                     "not a DVC output: dvc.yaml says why")
    p.add_argument("--metrics", required=True, help="metrics JSON to write")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate.client.generate import GenerateRequest, run
    from draftgate.client.target import TargetError, target_for
    from draftgate.config import ParamsError, load_params
    from draftgate.gates.result import GateNotPassed, require_passed

    try:
        params = load_params(args.params)
        require_passed(args.gate, "gate_prompts", "fix the prompts before generating")
        gp = params.generate
        if gp.budget_usd > 0 and gp.price.free:
            print("generate: budget_usd is set but generate.price is zero: worst cases cannot be "
                  "reserved, so the budget only stops after the fact; set generate.price", file=sys.stderr)
        out = Path(args.out)
        request = GenerateRequest(prompts=Path(args.prompts), out=out,
                                  journal=Path(args.journal) if args.journal else out / "journal.jsonl")
        with target(params, target_for) as t:
            done = run(params, request, t)
    except (ParamsError, GateNotPassed, TargetError, OSError, ValueError) as e:
        print(f"stages.generate: {e}", file=sys.stderr)
        return 2
    done.metrics.write(args.metrics)
    print(done.summary)
    return done.exit_code


@contextlib.contextmanager
def target(params: Any, remote: Any) -> Iterator[Any]:
    """Where requests go. `local`: start the local server for the run; its identity (weights,
    tokenizer, template, device) goes into every request hash. `vllm`: start vLLM on the target
    (or use the one at generate.base_url; draftgate/engine/target.py). Otherwise the remote API."""
    from draftgate.client import Target

    if params.generate.backend == "vllm":
        from draftgate.client.target import TargetError
        from draftgate.engine.launch import EngineError
        from draftgate.engine.target import generate_target

        try:
            with generate_target(params) as t:
                yield t
        except EngineError as e:   # names the engine's log file and the fix
            raise TargetError(str(e)) from None
        return
    if params.generate.backend != "local":
        yield remote(params.generate)
        return
    from draftgate.client.target import env_secrets
    from draftgate.serve.process import running, served_identity

    with running(params.serve) as url:   # no key is sent, but one in the environment is never written
        yield Target(url, identity=served_identity(url), extra_secrets=env_secrets(params.generate))


if __name__ == "__main__":
    sys.exit(main())
