"""Held-out prompts -> speculative outputs per proposer -> outputs table and figures.

The eval stage's work (measure.py) is built from these functions; the eval gate
(draftgate/checks/eval.py) reads the same held-out prompts with `heldout_rows` and recomputes plain
greedy decoding itself.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from draftgate.evaluate import stats
from draftgate.evaluate.loop import Decoded, Greedy, greedy_decode_batch, speculative_decode_batch


class EvalError(ValueError):
    """An input the evaluation cannot use; the message names the file and the fix."""


@dataclass(frozen=True)
class HeldOut:
    prompt_id: str
    prompt: list[int]          # the leading loss_mask == 0 part of input_ids
    input_ids: list[int]       # prompt + the reference completion (for the teacher-forced proxy)
    loss_mask: list[int]
    dataset: str = ""
    mode: str | None = None    # the serving mode the tokens table names (config.mode_name); reports group by it


@dataclass(frozen=True)
class Run:
    """One proposer setting over every prompt."""
    proposer: str              # eagle3 | ngram | oracle | random
    setting: str               # e.g. "ngram 5..5": unique per run
    outputs: list[Decoded]
    numbers: dict[str, float]  # numeric parameters of the setting (k, n_min, n_max)


def heldout_rows(tokens_path: str | Path, max_prompts: int | None = None) -> list[HeldOut]:
    """Kept held-out rows of tokens.parquet, in table order; the first `max_prompts` when set."""
    import pyarrow.parquet as pq

    path = Path(tokens_path)
    if not path.is_file():
        raise EvalError(f"{path}: not found; run the reconstruct stage (dvc repro reconstruct)")
    cols = ["prompt_id", "split", "input_ids", "loss_mask", "quarantine_reason"]
    try:
        # dataset and mode, when the table has them (reports per dataset and per serving mode).
        names = set(pq.read_schema(path).names)
        table = pq.read_table(path, columns=cols + [c for c in ("dataset", "mode") if c in names])
    except Exception as e:  # pyarrow's own error types
        raise EvalError(f"{path}: unreadable or missing columns {cols} ({type(e).__name__}: {e}); "
                        "rerun the reconstruct stage") from None
    rows = []
    for r in table.to_pylist():
        if r["split"] != "heldout" or r["quarantine_reason"] is not None:
            continue
        mask = list(r["loss_mask"])
        n = next((i for i, m in enumerate(mask) if m), len(mask))
        if n == 0:
            raise EvalError(f"{path}: held-out row {r['prompt_id']} has no prompt (loss_mask starts with 1)")
        rows.append(HeldOut(r["prompt_id"], list(r["input_ids"][:n]), list(r["input_ids"]), mask,
                            r.get("dataset") or "", r.get("mode")))
        if max_prompts is not None and len(rows) >= max_prompts:
            break
    if not rows:
        raise EvalError(f"{path}: no kept held-out row; raise prompts.heldout_fraction or check the tokens gate")
    return rows


def end_ids_from_contract(contract_path: str | Path) -> frozenset[int]:
    """The end-of-turn id the contract resolved by name from the tokenizer (roles.end_id)."""
    path = Path(contract_path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        end = doc["roles"]["end_id"]
    except FileNotFoundError:
        raise EvalError(f"{path}: not found; run the contract stage") from None
    except (ValueError, KeyError, TypeError):
        raise EvalError(f"{path}: no roles.end_id; rerun the contract stage") from None
    if not isinstance(end, int):
        raise EvalError(f"{path}: roles.end_id is {end!r}; the template's end token did not resolve to one id")
    return frozenset([end])


def end_ids_by_name(params: Any) -> frozenset[int]:
    """The template's end token resolved by name from the tokenizer (with its round trip checked):
    the gate's own resolution, independent of the contract file the stage reads."""
    from draftgate.templates import TemplateError, get_template
    from draftgate.tokenizers import TokenizerError, load_tokenizer

    try:
        tok = load_tokenizer(params.tokenizer)
        name = get_template(params.template.name).end_token
    except (TokenizerError, TemplateError) as e:
        raise EvalError(str(e)) from None
    tid = tok.hf.convert_tokens_to_ids(name)
    if not isinstance(tid, int) or tok.hf.encode(name, add_special_tokens=False) != [tid] \
            or tok.hf.decode([tid], skip_special_tokens=False) != name:
        raise EvalError(f"template {params.template.name}: end token {name!r} is not one id of the tokenizer "
                        "that round-trips; check tokenizer: and template: in params.yaml")
    return frozenset([tid])


def decode_all(model: Any, device: str, prompts: Sequence[HeldOut], make_proposer: Callable[[], Any], k: int,
               max_new_tokens: int, end_ids: frozenset[int], aux_layers: Sequence[int] | None = None,
               batch_size: int = 16) -> list[Decoded]:
    """Every prompt, `batch_size` rows per forward, one proposer object per prompt."""
    out: list[Decoded] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        out += speculative_decode_batch(model, device, [p.prompt for p in chunk], [make_proposer() for _ in chunk],
                                        k, max_new_tokens, end_ids, aux_layers)
    return out


def greedy_all(model: Any, device: str, prompts: Sequence[Sequence[int]], max_new_tokens: int,
               end_ids: frozenset[int], batch_size: int = 16) -> list[Greedy]:
    out: list[Greedy] = []
    for i in range(0, len(prompts), batch_size):
        out += greedy_decode_batch(model, device, prompts[i:i + batch_size], max_new_tokens, end_ids)
    return out


def summarise(run: Run, k: int, samples: int, seed: int) -> dict[str, Any]:
    """The run's figures: acceptance length (SGLang's), its bootstrap interval, per-position rates."""
    steps = [stats.PromptSteps(d.drafted, d.accepted, d.emitted) for d in run.outputs]
    lo, hi = stats.bootstrap_ci(steps, samples, seed)
    # Dicts, not lists: metrics files keep numbers only and DVC skips lists (draftgate/metrics.py).
    return {
        "acceptance_length": stats.acceptance_length(steps),
        "ci95": {"low": lo, "high": hi},
        "per_position": {str(i): r for i, r in enumerate(stats.per_position(steps, k), start=1)},
        "per_position_all": {str(i): r for i, r in enumerate(stats.per_position_all(steps, k), start=1)},
        "vllm_acceptance_length": stats.vllm_acceptance_length(steps),
        "accepted_fraction": stats.accepted_fraction(steps),
        "verify_forwards": sum(len(d.emitted) for d in run.outputs),
        "tokens": sum(len(d.ids) for d in run.outputs),
        "prompts": len(run.outputs),
        "settings": dict(run.numbers),
    }


def by_group(run: Run, prompts: Sequence[HeldOut], key: Callable[[HeldOut], str], samples: int,
             seed: int) -> dict[str, dict[str, Any]]:
    """Acceptance length and its bootstrap interval (over that group's prompts) per group of prompts."""
    groups: dict[str, list[stats.PromptSteps]] = {}
    for p, d in zip(prompts, run.outputs):
        groups.setdefault(key(p), []).append(stats.PromptSteps(d.drafted, d.accepted, d.emitted))
    out = {}
    for name, steps in sorted(groups.items()):
        lo, hi = stats.bootstrap_ci(steps, samples, seed)
        out[name] = {"acceptance_length": stats.acceptance_length(steps), "ci95": {"low": lo, "high": hi},
                     "prompts": len(steps)}
    return out


def mode_gap(by_mode: dict[str, dict[str, Any]], served: Sequence[str]) -> dict[str, Any]:
    """Best and worst served mode by acceptance length, and the gap between them. A served mode
    with no held-out prompt is named in `unmeasured`: its acceptance is unknown, not equal."""
    measured = {m: by_mode[m]["acceptance_length"] for m in served if m in by_mode}
    out: dict[str, Any] = {"unmeasured": [m for m in served if m not in by_mode]}
    if measured:
        best, worst = max(measured, key=measured.get), min(measured, key=measured.get)
        out.update(best=best, worst=worst, gap=measured[best] - measured[worst])
    return out


def outputs_table(prompts: Sequence[HeldOut], runs: Sequence[Run]) -> Any:
    """One row per (setting, prompt): the emitted ids and the per-step drafted/accepted/emitted counts."""
    import pyarrow as pa

    rows = []
    for run in runs:
        for p, d in zip(prompts, run.outputs):
            rows.append({"proposer": run.proposer, "setting": run.setting, "prompt_id": p.prompt_id,
                         "prompt_len": len(p.prompt), "output_ids": d.ids, "finish_reason": d.finish,
                         "drafted": d.drafted, "accepted": d.accepted, "emitted": d.emitted})
    schema = pa.schema([("proposer", pa.string()), ("setting", pa.string()), ("prompt_id", pa.string()),
                        ("prompt_len", pa.int32()), ("output_ids", pa.list_(pa.int32())),
                        ("finish_reason", pa.string()), ("drafted", pa.list_(pa.int16())),
                        ("accepted", pa.list_(pa.int16())), ("emitted", pa.list_(pa.int16()))])
    return pa.Table.from_pylist(rows, schema=schema)


# ------------------------------------------------------------ the drafter and its proxy

def load_eagle3(drafter_dir: str | Path, target: Any) -> Any:
    """The exported drafter (the files an engine loads), on the target's device, float32."""
    from draftgate.drafter.export import ExportError, load_drafter, read_info

    try:
        info = read_info(drafter_dir)
        drafter = load_drafter(drafter_dir, embed=target.embed_tokens.weight.detach().float().cpu(),
                               device=target.device)
    except ExportError as e:
        raise EvalError(f"{drafter_dir}: {e}") from None
    trained_on = (info.get("target") or {}).get("weights_fingerprint")
    if trained_on and trained_on != target.weights_fingerprint:
        raise EvalError(f"{drafter_dir}: trained against target weights {trained_on[:12]}, evaluating with "
                        f"{target.weights_fingerprint[:12]}; set hidden: to the drafter's target or retrain")
    if drafter.config.target_num_layers != target.num_layers:
        raise EvalError(f"{drafter_dir}: drafter expects a {drafter.config.target_num_layers}-layer target, "
                        f"got {target.num_layers}")
    return drafter


def simulated_acceptance(drafter: Any, target: Any, rows: Sequence[HeldOut], steps: int) -> dict[str, Any]:
    """SpecForge's teacher-forced proxy on the held-out rows: per-step accuracy, `sum_k prod acc_i`.

    Step i at position t sees the true tokens (teacher forcing) and the drafter's own hidden
    state; it is right when its argmax (mapped to target ids) equals the target's argmax at
    position t+1+i, counted where that position's next token is a completion token. A proxy:
    no verify loop, the reference completion (sampled, not greedy) as context, no bonus token.
    """
    import torch

    from draftgate.hidden.capture import capture

    layers = list(drafter.config.aux_layers)
    correct = [0] * steps
    total = [0] * steps
    with torch.inference_mode():
        for r in rows:
            ids = torch.tensor([r.input_ids], dtype=torch.long, device=target.device)
            aux, final = capture(target, ids, torch.ones_like(ids), layers)
            teacher = target.logits_from_final(final[0]).argmax(-1)              # [T]
            outs = drafter.ttt(aux.float(), ids, steps)
            n = ids.shape[1]
            mask = torch.tensor(r.loss_mask, dtype=torch.bool, device=target.device)
            for i, hidden in enumerate(outs):
                t = torch.arange(n, device=target.device)
                j = t + 1 + i                                                    # the teacher's position
                ok = j + 1 < n
                t, j = t[ok], j[ok]
                keep = mask[j + 1]
                drafted = drafter.to_target(drafter.logits(hidden[0, t]).argmax(-1))
                correct[i] += int(((drafted == teacher[j]) & keep).sum())
                total[i] += int(keep.sum())
    acc = [c / n if n else math.nan for c, n in zip(correct, total)]
    return {"step_accuracy": acc, "simulated_acceptance_length": stats.simulated_acceptance_length(acc),
            "positions": total[0] if total else 0}
