"""The eval gate's check: is speculative decoding lossless? Recomputed with the target.

`compute(inputs, params_path)` (handed to the engine by stages/gate_eval.py) reads the eval stage's
outputs (artifact `eval`: data/eval/outputs.parquet) and the tokens table (the held-out prompts,
cut from input_ids by loss_mask here, never taken from the outputs), resolves the template's end
token by name from the tokenizer itself (not from the contract file the stage read), loads the
target named by params.yaml `hidden:` and runs PLAIN greedy decoding for every held-out prompt
the outputs name: one token per row per forward (eval.batch_size rows together),
with max_new_tokens from `eval:`.

    eval_checks   one per outputs row: the output against the gate's greedy ids; at the first
                  divergence, the target's top two logits there (a divergence is a tie when the
                  output took the runner-up within `gates.eval.tie_tolerance`), and after a tie
                  the rest of the output teacher-forced (each token the argmax within tolerance);
                  the stop rule and the per-step counts re-derived from the lists themselves;
                  the prompt's serving mode recomputed from its ids (checks/serving.py)
    eval_facts    one row: the prompts expected (kept held-out rows, eval.max_prompts), k,
                  max_new_tokens, the tolerance, the per-mode floor (gates.eval.min_mode_acceptance_length),
                  the engine params ask for (eval.engine) and the one engine.json records
    eval_served   the served modes (serving.modes): each must reach the floor on its prompts
    eval_engine   with eval.engine vllm: one row per spec-decode counter (drafts, draft tokens,
                  accepted, accepted at each position 1..k): the engine's, parsed here from the two
                  /metrics scrapes the stage kept (--input engine=data/eval/engine.json) as their
                  difference, and the replay's, counted here from the eagle3 rows' per-step lists
                  as vLLM counts (a draft = a step that drafted). The engine's outputs are rows of
                  the outputs table (proposer "vllm", no per-step counts) checked like any other
                  against the gate's greedy decoding.

Nothing here decides: expectations/eval.json's view compares and judges (docs/evaluation.md).
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

from draftgate.gates.compute import Computed
from draftgate.gates.suite import GateError


def compute(inputs: dict[str, str], params_path: str) -> Computed:
    import pyarrow as pa

    from draftgate.config import ParamsError, load_params
    from draftgate.evaluate.run import EvalError, end_ids_by_name, greedy_all, heldout_rows

    try:
        params = load_params(params_path)
    except ParamsError as e:
        raise GateError(str(e)) from None
    missing = [n for n in ("eval", "tokens") if n not in inputs]
    if missing:
        raise GateError("the eval gate reads the outputs (artifact `eval`) and --input tokens=data/tokens/tokens.parquet; "
                        f"missing: {', '.join(missing)}")
    ep, gp = params.eval, params.gates.eval
    try:
        prompts = {h.prompt_id: h for h in heldout_rows(inputs["tokens"], None)}
        expected = len(heldout_rows(inputs["tokens"], ep.max_prompts))
        end_ids = end_ids_by_name(params)
    except EvalError as e:
        raise GateError(str(e)) from None
    outputs = read_outputs(inputs["eval"])
    modes = _modes(params, prompts)
    recorded = read_engine(inputs.get("engine"), ep.engine)
    engine = engine_table(recorded, outputs, prompts, ep.k) if ep.engine == "vllm" else []

    from draftgate.target import load_target

    target = load_target(params.hidden, ep.device, "eval.device")
    named = [pid for pid in dict.fromkeys(r["prompt_id"] for r in outputs) if pid in prompts]
    runs = greedy_all(target.model, target.device, [prompts[p].prompt for p in named], ep.max_new_tokens,
                      end_ids, ep.batch_size)
    greedy = dict(zip(named, runs))
    rows = [{**check_row(r, prompts.get(r["prompt_id"]), greedy.get(r["prompt_id"]), target, ep.k,
                         ep.max_new_tokens, end_ids, gp.tie_tolerance), "mode": modes.get(r["prompt_id"])}
            for r in outputs]
    facts = pa.Table.from_pylist(
        [{"expected_prompts": expected, "k": ep.k, "max_new_tokens": ep.max_new_tokens,
          "tie_tolerance": gp.tie_tolerance, "greedy_prompts": len(greedy),
          "mode_floor": gp.min_mode_acceptance_length, "engine": ep.engine,
          "engine_recorded": recorded.get("engine") if recorded else None,
          "engine_rows": sum(1 for r in outputs if r["proposer"] == ENGINE_PROPOSER)}],
        schema=pa.schema([("expected_prompts", pa.int64()), ("k", pa.int64()), ("max_new_tokens", pa.int64()),
                          ("tie_tolerance", pa.float64()), ("greedy_prompts", pa.int64()),
                          ("mode_floor", pa.float64()), ("engine", pa.string()), ("engine_recorded", pa.string()),
                          ("engine_rows", pa.int64())]))
    served = pa.table({"mode": pa.array([m.name for m in params.serving.modes], pa.string())})
    report = {"greedy_prompts": len(greedy), "rows": len(rows),
              "exact_rows": sum(1 for r in rows if r["exact"]),
              "tie_rows": sum(1 for r in rows if r["tie"]),
              "unexplained_rows": sum(1 for r in rows if r["unexplained"] > 0)}
    report["prompts_by_mode"] = dict(sorted(Counter(modes.values()).items()))
    if engine:
        report["engine_counts"] = {r["counter"]: {"engine": r["engine"], "replay": r["replay"]} for r in engine}
    engine_schema = pa.schema([("counter", pa.string()), ("engine", pa.int64()), ("replay", pa.int64())])
    return Computed(tables={"eval_checks": pa.Table.from_pylist(rows, schema=checks_schema()),
                            "eval_facts": facts, "eval_served": served,
                            "eval_engine": pa.Table.from_pylist(engine, schema=engine_schema)}, report=report)


ENGINE_PROPOSER = "vllm"     # the outputs rows of the engine's own decoding (evaluate/engine.py)
_SPEC = "vllm:spec_decode_num_"


def read_engine(path: str | None, wanted: str) -> dict | None:
    """engine.json as the eval stage wrote it; required when eval.engine is vllm."""
    import json

    if path is None:
        if wanted == "vllm":
            raise GateError("eval.engine is vllm: pass --input engine=data/eval/engine.json (the engine's record)")
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GateError(f"{path}: not found; run the eval stage (dvc repro eval)") from None
    except ValueError as e:
        raise GateError(f"{path}: not JSON ({e}); rerun the eval stage") from None


def scrape_totals(text: str) -> dict[tuple[str, str | None], float]:
    """(counter, position label) -> value, summed over the other labels, of vLLM's spec-decode
    counters in a /metrics scrape. Written here, apart from the stage's reader (evaluate/engine.py):
    a line is `name{label="v",...} value`, or `name value` without labels; `#` lines are comments."""
    out: dict[tuple[str, str | None], float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(_SPEC) or not line.split()[0].split("{")[0].endswith("_total"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            labels, value = rest.rsplit("}", 1)
            position = next((part.split("=", 1)[1].strip('"') for part in labels.split(",")
                             if part.split("=", 1)[0].strip() == "position"), None)
        else:
            name, value = line.split()[:2]
            position = None
        key = (name[len(_SPEC):].removesuffix("_total"), position)
        out[key] = out.get(key, 0.0) + float(value.split()[0])
    return out


def engine_table(recorded: dict | None, outputs: list[dict], prompts: dict[str, Any], k: int) -> list[dict]:
    """The engine's counters (after minus before) beside the replay's, recounted from its steps."""
    recorded = recorded or {}
    before = scrape_totals(str(recorded.get("metrics_before") or ""))
    after = scrape_totals(str(recorded.get("metrics_after") or ""))
    measured = bool(after)           # no scrape: every engine figure null, which no replay figure equals
    engine = {key: int(after.get(key, 0.0) - before.get(key, 0.0)) for key in after}
    steps = [(d, a) for r in outputs if r["proposer"] == "eagle3" and r["prompt_id"] in prompts
             for d, a in zip(r["drafted"] or [], r["accepted"] or []) if d > 0]
    rows = [("drafts", ("drafts", None), len(steps)),
            ("draft_tokens", ("draft_tokens", None), sum(d for d, _ in steps)),
            ("accepted", ("accepted_tokens", None), sum(a for _, a in steps))]
    rows += [(f"accepted_at_position_{i}", ("accepted_tokens_per_pos", str(i - 1)),
              sum(1 for _, a in steps if a >= i)) for i in range(1, k + 1)]
    out = [{"counter": name, "engine": engine.get(key, 0) if measured else None, "replay": replay}
           for name, key, replay in rows]
    # A position past k accepted anything: the engine drafted more tokens than the replay.
    extra = sum(v for (n, pos), v in engine.items() if n == "accepted_tokens_per_pos" and pos is not None
                and int(pos) >= k)
    out.append({"counter": f"accepted_past_position_{k}", "engine": extra if measured else None, "replay": 0})
    return out


def _modes(params: Any, prompts: dict[str, Any]) -> dict[str, str]:
    """Each held-out prompt's serving mode recomputed from its prompt ids (checks/serving.py's rule),
    the think and special ids resolved by name from the tokenizer, as the end ids are here."""
    from draftgate.checks.serving import prompt_mode, tool_signature
    from draftgate.templates import get_template
    from draftgate.tokenizers import load_tokenizer

    template = get_template(params.template.name)
    tok = load_tokenizer(params.tokenizer)
    think = tuple(tok.token_id(n) for n in template.think_tokens) if template.think_tokens else None
    signature = tool_signature(params, {n: tok.token_id(n) for n in template.special_names})
    blank_bytes = frozenset(b" \t\n\r")

    @functools.lru_cache(maxsize=None)
    def blank(i: int) -> bool:
        b = tok.token_bytes(i)
        return bool(b) and all(ch in blank_bytes for ch in b)

    return {pid: prompt_mode(h.prompt, think, blank, signature) for pid, h in prompts.items()}


def checks_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("proposer", pa.string()), ("setting", pa.string()), ("prompt_id", pa.string()),
        ("heldout", pa.bool_()), ("n_output", pa.int64()), ("n_greedy", pa.int64()),
        ("exact", pa.bool_()), ("first_divergence", pa.int64()), ("divergence_gap", pa.float64()),
        ("tie", pa.bool_()), ("ties_after", pa.int64()), ("unexplained", pa.int64()),
        ("stop_ok", pa.bool_()), ("steps_ok", pa.bool_()), ("verify_forwards", pa.int64()),
        ("mode", pa.string())])     # the prompt's serving mode, recomputed from its ids


def read_outputs(path: str) -> list[dict]:
    import pyarrow.parquet as pq

    p = Path(path)
    p = p / "outputs.parquet" if p.is_dir() else p
    cols = ["proposer", "setting", "prompt_id", "output_ids", "drafted", "accepted", "emitted"]
    try:
        # The engine's rows hold no per-step lists (null): it reports counters, not steps.
        return pq.read_table(p, columns=cols).to_pylist()
    except FileNotFoundError:
        raise GateError(f"{p}: not found; run the eval stage (dvc repro eval)") from None
    except Exception as e:  # pyarrow's own error types
        raise GateError(f"{p}: unreadable or missing columns {cols} ({type(e).__name__}: {e}); "
                        "rerun the eval stage") from None


def check_row(r: dict, held: Any, greedy: Any, target: Any, k: int, max_new_tokens: int,
              end_ids: frozenset[int], tol: float) -> dict:
    out = list(r["output_ids"] or [])
    drafted, accepted, emitted = (list(r[c] or []) for c in ("drafted", "accepted", "emitted"))
    # The engine's rows: no per-step lists to check (its counters are eval_engine's), none is "no steps".
    counted = r["proposer"] != ENGINE_PROPOSER
    row = {"proposer": r["proposer"], "setting": r["setting"], "prompt_id": r["prompt_id"],
           "heldout": held is not None, "n_output": len(out), "n_greedy": None, "exact": False,
           "first_divergence": None, "divergence_gap": None, "tie": False, "ties_after": 0,
           "unexplained": 0, "stop_ok": stop_ok(out, max_new_tokens, end_ids),
           "steps_ok": steps_ok(out, drafted, accepted, emitted, k) if counted else None,
           "verify_forwards": len(emitted)}
    if greedy is None:
        return row
    ref = greedy.ids
    row["n_greedy"] = len(ref)
    if out == ref:
        row["exact"] = True
        return row
    p = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
    row["first_divergence"] = p
    if p >= len(out) or p >= len(ref):
        row["unexplained"] = 1          # one stopped where the other went on: no tie explains that
        return row
    top_id, top_v, second_id, second_v = greedy.top2[p]
    row["divergence_gap"] = top_v - second_v
    if out[p] != second_id or top_v - second_v > tol:
        row["unexplained"] = 1
        return row
    row["tie"] = True
    # After a tie the two sequences may part for good; what follows must still be the target's
    # own greedy choice given the output so far, each token the argmax within the tolerance.
    from draftgate.evaluate.loop import teacher_forced_logits

    logits = teacher_forced_logits(target.model, target.device, held.prompt, out)
    chosen = logits.gather(-1, _col(out, logits)).squeeze(-1)
    gaps = (logits.max(-1).values - chosen)[p + 1:]
    row["unexplained"] = int((gaps > tol).sum())
    row["ties_after"] = int(((gaps > 0) & (gaps <= tol)).sum())
    return row


def _col(ids: list[int], like: Any) -> Any:
    import torch

    return torch.tensor(ids, dtype=torch.long, device=like.device)[:, None]


def stop_ok(out: list[int], max_new_tokens: int, end_ids: frozenset[int]) -> bool:
    """Greedy's stop rule: no end id before the last token; without one, exactly max_new_tokens."""
    if not out or len(out) > max_new_tokens or any(t in end_ids for t in out[:-1]):
        return False
    return out[-1] in end_ids or len(out) == max_new_tokens


def steps_ok(out: list[int], drafted: list[int], accepted: list[int], emitted: list[int], k: int) -> bool:
    """The per-step counts are possible and account for every output token (1 from the prefill)."""
    if not (len(drafted) == len(accepted) == len(emitted)):
        return False
    for i, (d, a, e) in enumerate(zip(drafted, accepted, emitted)):
        last = i == len(emitted) - 1
        if not (0 <= a <= d <= k and 1 <= e <= a + 1) or (not last and e != a + 1):
            return False
    return 1 + sum(emitted) == len(out)
