"""DVC stage `generate`: prompts -> OpenAI-compatible API -> journal.jsonl -> responses.parquet.

python -m stages.generate --params params.yaml --prompts data/prompts/prompts.parquet \
    --gate data/gates/prompts.json --out data/responses --metrics metrics/generate.json

The journal (`--journal`, default `<out>/journal.jsonl`) is append-only and survives reruns:
finished prompts are skipped, so a crashed or stopped run resumes where it was.
`generate.budget_usd` bounds the whole journal, every run together (draftgate/client/budget.py).
With `backend: local` this stage starts the local server (draftgate.serve) for the run and passes
its identity (weights, tokenizer, template fingerprints) into every request hash. The journal's line count, size and sha256 go into
the metrics: DVC versions the table; the journal is not a DVC output (journal.py says why).

Exit 0 when every prompt in scope was attempted or the budget ran out (the responses gate judges
completeness); 1 when the run stopped on 401 / credits (journal, table and metrics are still
written); 2 on unusable input or params.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
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
    from draftgate import client
    from draftgate.client import hashcache
    from draftgate.client.request import build_body, request_hash
    from draftgate.client.budget import line_cost
    from draftgate.client.journal import JournalIndex, index_path
    from draftgate.client.table import PromptFile, write_responses
    from draftgate.client.target import TargetError, target_for
    from draftgate.config import ParamsError, as_dict, load_params
    from draftgate.gates.result import GateNotPassed, require_passed
    from draftgate.metrics import StageMetrics

    try:
        params = load_params(args.params)
        require_passed(args.gate, "gate_prompts", "fix the prompts before generating")
        # Streamed from prompts.parquet (twice in the run, once for the table): bounded memory.
        prompts = PromptFile(args.prompts, params.generate.limit)
        gp = params.generate
        if gp.budget_usd > 0 and gp.price.free:
            print("generate: budget_usd is set but generate.price is zero: worst cases cannot be "
                  "reserved, so the budget only stops after the fact; set generate.price", file=sys.stderr)
        out = Path(args.out)
        journal = Path(args.journal) if args.journal else out / "journal.jsonl"
        with target(params, target_for) as t:
            # Every prompt's request hash, from the last run when nothing that makes one changed.
            key, known = hashcache.checked(prompts, gp, t.identity, journal)
            result = client.run(prompts, gp, t, journal, known=known)
        if known is None:
            hashcache.save(hashcache.cache_path(journal), key, result.hash_bytes, result.key_bytes)
    except (ParamsError, GateNotPassed, TargetError, OSError, ValueError) as e:
        print(f"stages.generate: {e}", file=sys.stderr)
        return 2

    def hash_of(p: Any) -> str:
        return request_hash(build_body(p, gp), gp.backend, t.identity)
    # The run's own scan when it appended nothing; else one scan now, kept beside the journal, so
    # the next run reads only what is appended after this one.
    index = result.index or JournalIndex.scan(journal, line_cost, cache=index_path(journal))
    stats = write_responses(out / "responses.parquet", prompts, hash_of, journal, result.stop_reason,
                            hashes=result.hash_bytes, index=index, keys=result.key_bytes)
    metrics = StageMetrics("generate", rows_in=len(prompts), params=as_dict(gp))
    metrics.rows_out = stats.ok
    for reason, n in sorted(stats.failure_reasons.items()):
        metrics.drop(reason, n)
    metrics.figures.update(result.figures())
    metrics.figures["table_cost_usd"] = round(stats.cost_usd, 6)
    metrics.figures.update(journal_figures(journal, index))
    metrics.write(args.metrics)
    budget = f" of ${gp.budget_usd:.4f}" if gp.budget_usd else ""
    print(f"generate: {len(prompts)} prompts: {metrics.rows_out} ok, {len(prompts) - metrics.rows_out} not "
          f"({result.skipped} already done, {result.sent} sent this run, ${result.spent_usd:.4f} spent this run, "
          f"${result.journal_spent_usd:.4f}{budget} by the journal in total)"
          + (f"; stopped: {result.stop_reason}" if result.stop_reason else ""))
    return result.exit_code


@contextlib.contextmanager
def target(params: Any, remote: Any) -> Iterator[Any]:
    """Where requests go. `local`: start the local server for the run; its identity (weights,
    tokenizer, template, device) goes into every request hash. Otherwise the remote API."""
    from draftgate.client import Target

    if params.generate.backend != "local":
        yield remote(params.generate)
        return
    from draftgate.client.target import env_secrets
    from draftgate.serve.process import running, served_identity

    with running(params.serve) as url:   # no key is sent, but one in the environment is never written
        yield Target(url, identity=served_identity(url), extra_secrets=env_secrets(params.generate))


def journal_figures(path: Path, index: Any = None) -> dict[str, Any]:
    """The journal's identity for the metrics: DVC does not cache it (journal.py explains).
    `index`: a scan of the journal; it hashed the complete lines it read, so a journal of just those
    bytes is not read twice."""
    with contextlib.suppress(FileNotFoundError):
        if index is not None and index.complete_bytes == path.stat().st_size:
            return {"journal_sha256": index.complete_sha256, "journal_lines": index.complete_lines,
                    "journal_bytes": index.complete_bytes}
    h, lines, size = hashlib.sha256(), 0, 0
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            lines += block.count(b"\n")
            size += len(block)
    return {"journal_sha256": h.hexdigest(), "journal_lines": lines, "journal_bytes": size}


if __name__ == "__main__":
    sys.exit(main())
