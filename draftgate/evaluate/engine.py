"""`eval.engine: vllm`: the exported drafter served by vLLM's own EAGLE-3 decoding, beside our replay.

The engine (draftgate/engine) serves the target the replay decodes (engine/target.py
`served_model`: the hidden stage's target, in the checkpoint's own dtype: float32 for the embedded
default, as the replay) with `--speculative-config {"method": "eagle3", "model": <the speculators
export>, "num_speculative_tokens": eval.k}`. Each held-out prompt goes to /v1/completions as its
token ids (the ids the replay decodes: no template in between), greedy (temperature 0), at most
`eval.max_new_tokens` tokens, stopping at the contract's end ids (`stop_token_ids`, with
`ignore_eos`: the engine's idea of eos is not assumed to be ours), `return_token_ids` on; the served
`prompt_token_ids` must equal ours. `eval.batch_size` requests are in flight together (the engine
batches them as it would any load).

/metrics is scraped before the first request and after the last: the deltas of vLLM's
spec-decode counters are what this run drafted and accepted (`vllm:spec_decode_num_drafts_total`,
`..._num_draft_tokens_total`, `..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total`
per 0-based `position`), summed over the label sets of one engine. Both scrapes are kept as the
engine sent them (engine.json), so the eval gate parses and compares them itself.

Measured (docs/engines.md, "Acceptance"): on the demo's 16 held-out prompts (k=4, 64 tokens) the
engine's counters equal our replay's exactly (761 drafts) and its outputs equal greedy 16/16.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from draftgate.evaluate.run import EvalError

# vLLM's counter names (vllm/v1/metrics/loggers.py, SpecDecodingProm); the per-position one has a
# 0-based `position` label. The stage reports positions 1-based, as the replay's per_position.
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SETTING = "vllm_eagle3"          # the engine's rows in outputs.parquet: proposer "vllm", this setting

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class EngineEvalError(EvalError):
    """The engine's answer cannot be used; the message names what and the fix."""


@dataclass(frozen=True)
class Counts:
    """Speculative-decoding counters of one run: vLLM's definitions (a draft = a verify step that
    drafted at least one token), per_position[i] = drafts whose position i+1 was accepted."""
    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "per_position": {str(i): n for i, n in enumerate(self.per_position, start=1)}}

    @property
    def acceptance_length(self) -> float:
        """vLLM's `1 + accepted / drafts` (bonus token included)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else float("nan")


def speculative_args(drafter_dir: str | Path, k: int) -> tuple[str, str]:
    """The server flags that make vLLM draft with our export, k tokens per step."""
    config = {"method": "eagle3", "model": str(Path(drafter_dir).resolve()), "num_speculative_tokens": int(k)}
    return ("--speculative-config", json.dumps(config, sort_keys=True))


def spec_counts(scrape: str, k: int) -> Counts:
    """The spec-decode counters of a /metrics scrape (Prometheus text), summed over label sets."""
    totals: dict[str, float] = {}
    per_pos = [0.0] * k
    for line in scrape.splitlines():
        m = _SAMPLE.match(line)
        if not m or not m["name"].startswith("vllm:spec_decode_"):
            continue
        value = float(m["value"])
        if m["name"] == ACCEPTED_PER_POS:
            pos = int(dict(_LABEL.findall(m["labels"] or "")).get("position", -1))
            if 0 <= pos < k:
                per_pos[pos] += value
            elif value:
                raise EngineEvalError(f"/metrics: accepted tokens at position {pos}, outside eval.k = {k}: "
                                      "the engine drafts another k than the replay (its --speculative-config)")
        else:
            totals[m["name"]] = totals.get(m["name"], 0.0) + value
    return Counts(int(totals.get(DRAFTS, 0)), int(totals.get(DRAFT_TOKENS, 0)), int(totals.get(ACCEPTED, 0)),
                  tuple(int(v) for v in per_pos))


def delta(before: Counts, after: Counts) -> Counts:
    return Counts(after.drafts - before.drafts, after.draft_tokens - before.draft_tokens,
                  after.accepted - before.accepted,
                  tuple(a - b for a, b in zip(after.per_position, before.per_position)))


def replay_counts(outputs: Sequence[Any], k: int) -> Counts:
    """Our replay's per-step counts (evaluate/loop.py Decoded) as vLLM counts them."""
    steps = [(d, a) for o in outputs for d, a in zip(o.drafted, o.accepted) if d > 0]
    return Counts(len(steps), sum(d for d, _ in steps), sum(a for _, a in steps),
                  tuple(sum(1 for _, a in steps if a >= i) for i in range(1, k + 1)))


@dataclass(frozen=True)
class EngineRun:
    ids: list[list[int]]          # per prompt, the completion ids (the end id included when it stopped)
    finish: list[str]             # "stop" | "length", as the engine said
    before: str                   # /metrics before the first request, as sent
    after: str                    # /metrics after the last answer, as sent
    counts: Counts


def decode(root_url: str, served_name: str, prompts: Sequence[Sequence[int]], k: int, max_new_tokens: int,
           end_ids: frozenset[int], in_flight: int) -> EngineRun:
    """Every prompt through the engine, greedy; the counters' deltas over the run."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    with httpx.Client(base_url=root_url, timeout=httpx.Timeout(600.0, connect=30.0)) as client:
        def scrape() -> str:
            r = client.get("/metrics")
            r.raise_for_status()
            return r.text

        def one(prompt: Sequence[int]) -> dict:
            body = {"model": served_name, "prompt": list(prompt), "max_tokens": max_new_tokens, "temperature": 0.0,
                    "stop_token_ids": sorted(end_ids), "ignore_eos": True, "return_token_ids": True,
                    "skip_special_tokens": False}
            r = client.post("/v1/completions", json=body)
            if r.status_code != 200:
                raise EngineEvalError(f"the engine answered {r.status_code} to a completion: {r.text[:300]}")
            return r.json()["choices"][0]

        before = scrape()
        with ThreadPoolExecutor(max(1, in_flight)) as pool:
            answers = list(pool.map(one, prompts))
        after = scrape()
    ids, finish = [], []
    for i, (prompt, a) in enumerate(zip(prompts, answers)):
        served = a.get("prompt_token_ids")
        if served is not None and list(served) != list(prompt):
            raise EngineEvalError(f"held-out prompt {i}: the engine served other prompt ids than sent "
                                  f"({len(served)} vs {len(prompt)} ids); is its tokenizer adding a BOS?")
        if a.get("token_ids") is None:
            raise EngineEvalError("the engine's answer has no token_ids: it ignores return_token_ids "
                                  "(vLLM >= 0.10.2 returns them)")
        ids.append([int(t) for t in a["token_ids"]])
        finish.append("stop" if a.get("finish_reason") == "stop" else "length")
    return EngineRun(ids, finish, before, after, delta(spec_counts(before, k), spec_counts(after, k)))


def measure(params: Any, prompts: Sequence[Any], drafter_dir: Path, end_ids: frozenset[int],
            replay: Sequence[Any]) -> tuple[EngineRun, dict[str, Any], dict[str, Any]]:
    """Serve the target with the export, decode `prompts` (run.HeldOut) and compare with `replay`
    (the eagle3 run's Decoded outputs): (the run, the report block, the record for engine.json)."""
    from draftgate.client.target import TargetError
    from draftgate.engine.launch import EngineError, launch_settings, running_vllm
    from draftgate.engine.target import served_model

    ep = params.eval
    if not (Path(drafter_dir) / "config.json").is_file():
        raise EngineEvalError(f"{drafter_dir}: no config.json; eval.engine vllm serves the speculators export "
                              "(the train stage writes data/drafter/speculators)")
    try:
        model = served_model(params.hidden)
        settings = launch_settings(params.engine)
        settings["extra_args"] = (*settings["extra_args"], *speculative_args(drafter_dir, ep.k))
        with running_vllm(model.path, served_name="target", **settings) as engine:
            print(f"eval: vLLM serving {model.path} with {drafter_dir} (k={ep.k}) at {engine.base_url} "
                  f"(pid {engine.pid}, log {engine.log_path})")
            run = decode(engine.root_url, engine.served_name, [p.prompt for p in prompts], ep.k,
                         ep.max_new_tokens, end_ids, ep.batch_size)
            command = list(engine.command)
    except (EngineError, TargetError) as e:
        raise EngineEvalError(f"eval.engine vllm: {e}") from None
    ours = replay_counts(replay, ep.k)
    same = sum(1 for a, b in zip(run.ids, replay) if a == b.ids)
    report = {
        "definition": "vLLM's own EAGLE-3 decoding of the exported drafter (speculators layout) on the held-out "
                      "prompts, greedy, the same k and max_new_tokens; counters are deltas of its /metrics; "
                      "acceptance_length = 1 + accepted / drafts (vLLM's); replay_* the same counts from our "
                      "replay's steps",
        "acceptance_length": run.counts.acceptance_length, "replay_acceptance_length": ours.acceptance_length,
        "drafts": run.counts.drafts, "replay_drafts": ours.drafts,
        "draft_tokens": run.counts.draft_tokens, "replay_draft_tokens": ours.draft_tokens,
        "accepted": run.counts.accepted, "replay_accepted": ours.accepted,
        "counts_equal": run.counts == ours, "outputs_equal_replay": same, "outputs": len(run.ids),
        "per_position": {str(i): {"engine": a, "replay": b}
                         for i, (a, b) in enumerate(zip(run.counts.per_position, ours.per_position), start=1)},
    }
    record = {"engine": "vllm", "k": ep.k, "max_new_tokens": ep.max_new_tokens, "drafter": str(drafter_dir),
              "target": str(model.path), "command": command, "metrics_before": run.before,
              "metrics_after": run.after}
    return run, report, record
