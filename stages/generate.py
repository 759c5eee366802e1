"""DVC stage `generate`: prompts -> OpenAI-compatible API -> journal.jsonl -> responses.parquet.

python -m stages.generate --params params.yaml --prompts data/prompts/prompts.parquet \
    --gate data/gates/prompts.json --out data/responses --metrics metrics/generate.json

The journal (`<out>/journal.jsonl`) is append-only and survives reruns: finished prompts are
skipped, so a crashed or stopped run resumes where it was. Exit 0 when every prompt in scope was
attempted or the budget ran out (the responses gate judges completeness); 1 when the run stopped
on 401 / credits (journal, table and metrics are still written); 2 on unusable input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Iterator

OPENROUTER_URL = "https://openrouter.ai/api/v1"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stages.generate", description=__doc__.splitlines()[0])
    p.add_argument("--params", required=True, help="params.yaml (generate and serve sections)")
    p.add_argument("--prompts", required=True, help="prompts.parquet")
    p.add_argument("--gate", required=True, help="the prompts gate result; refuses to run unless success")
    p.add_argument("--out", required=True, help="directory for journal.jsonl and responses.parquet")
    p.add_argument("--metrics", required=True, help="metrics JSON to write")
    return p.parse_args(argv)


class StageError(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftgate import client
    from draftgate.client.journal import read_journal
    from draftgate.config import ParamsError, as_dict, load_params
    from draftgate.io import write_parquet
    from draftgate.metrics import StageMetrics

    try:
        params = load_params(args.params)
        check_gate(args.gate)
        prompts = client.select(client.read_prompts(args.prompts), params.generate.limit)
        gp = params.generate
        if gp.budget_usd > 0 and not (gp.price.prompt_usd_per_mtok or gp.price.completion_usd_per_mtok):
            print("generate: budget_usd is set but generate.price is zero: worst cases cannot be "
                  "reserved, so the budget only stops after the fact; set generate.price", file=sys.stderr)
        out = Path(args.out)
        journal = out / "journal.jsonl"
        with target_for(params) as target:
            result = client.run(prompts, gp, target, journal)
    except (ParamsError, StageError, OSError, ValueError) as e:
        print(f"stages.generate: {e}", file=sys.stderr)
        return 2

    table = client.responses_table(prompts, result.hashes, read_journal(journal).records, result.stop_reason)
    write_parquet(out / "responses.parquet", table)
    metrics = StageMetrics("generate", rows_in=len(prompts), params=as_dict(gp))
    status = table.column("status").to_pylist()
    metrics.rows_out = status.count("ok")
    for reason in table.column("failure_reason").to_pylist():
        if reason is not None:
            metrics.drop(reason)
    metrics.figures.update(result.figures())
    metrics.figures["table_cost_usd"] = round(sum(c or 0.0 for c in table.column("cost_usd").to_pylist()), 6)
    metrics.write(args.metrics)
    print(f"generate: {len(prompts)} prompts: {metrics.rows_out} ok, {len(prompts) - metrics.rows_out} not "
          f"({result.skipped} already done, {result.sent} sent this run, ${result.spent_usd:.4f} spent)"
          + (f"; stopped: {result.stop_reason}" if result.stop_reason else ""))
    return result.exit_code


def check_gate(path: str) -> None:
    try:
        gate = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StageError(f"{path}: gate result not found; run the prompts gate first (dvc repro)") from None
    except ValueError as e:
        raise StageError(f"{path}: not JSON ({e}); rerun the prompts gate") from None
    if not isinstance(gate, dict) or gate.get("success") is not True:
        raise StageError(f"{path}: the prompts gate did not pass (success: {gate.get('success') if isinstance(gate, dict) else gate!r}); "
                         "fix the prompts (see the Data Docs report) before generating")


@contextlib.contextmanager
def target_for(params) -> Iterator:
    from draftgate.client import Target

    gp = params.generate
    if gp.backend == "local":
        from draftgate.serve.local import running

        with running(params.serve) as base_url:
            yield Target(base_url)
        return
    key = os.environ.get(gp.api_key_env) or None
    if gp.backend == "openrouter":
        if key is None:
            raise StageError(f"environment variable {gp.api_key_env} is not set; export your OpenRouter key "
                             f"there (or point generate.api_key_env at the variable that holds it)")
        headers = {"X-Title": gp.app_title}
        if gp.http_referer:
            headers["HTTP-Referer"] = gp.http_referer
        yield Target(check_key_transport(gp.base_url or OPENROUTER_URL, key, gp.api_key_env), key, headers)
        return
    if not gp.base_url:
        raise StageError("generate.base_url is required for backend openai (e.g. http://host:8000/v1)")
    if key is None:
        print(f"generate: {gp.api_key_env} is not set; sending requests without an API key", file=sys.stderr)
    yield Target(check_key_transport(gp.base_url, key, gp.api_key_env), key)


def check_key_transport(base_url: str, key: str | None, env: str) -> str:
    """A key travels only over https, or plain http to this machine (a local test server)."""
    from urllib.parse import urlsplit

    url = urlsplit(base_url)
    if key and url.scheme != "https" and url.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise StageError(f"generate.base_url {base_url!r} is plain http to another host: the key in {env} would "
                         "travel unencrypted; use https, or unset the variable / point generate.api_key_env "
                         "elsewhere for a server that needs no key")
    return base_url


if __name__ == "__main__":
    sys.exit(main())
