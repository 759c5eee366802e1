"""The interop check, run by the side environment's Python (make interop): each export loaded by
the library that reads its layout, through that library's own class, compared with draftgate.

    .venv-interop/bin/python interop/check.py REF_DIR [--report report.json]

REF_DIR is what interop/reference.py wrote (reference.json, reference.safetensors); nothing of
draftgate is imported here. Per export:

- speculators layout: `SpeculatorModel.from_pretrained` (speculators 0.9.0 resolves
  Eagle3DraftModel from the config), with the export's own config except the verifier, pointed at
  the local target folder (offline, the hub id in the file cannot be fetched; the verifier gives
  only verifier_norm/verifier_lm_head, which the forward without a loss never uses).
- SGLang layout: SpecForge's own warm start of a pretrained draft (`AutoDraftModel.from_config` ->
  `LlamaForCausalLMEagle3`, `warm_start_draft_model`), its embedding filled by the model's own
  `load_embedding` from the target folder, as SGLang shares the target's.

Strict key report: every file tensor must land in a parameter of the same name and equal it
value for value after loading (a name the loader does not know is "unexpected"; a parameter the
file does not fill, other than those the library fills from the verifier, is "missing"). Then a
forward on the fixed inputs: speculators' own `forward` (its TTT steps, teacher-forced) with the
logits read off `lm_head` by a forward hook, SpecForge's `forward` at step 0; max abs logit
difference and argmax agreement against draftgate's over the positions both define. An export
passes with no unexpected or missing key, every tensor equal, max abs difference <= --atol and
argmax agreement >= --min-agree. Exit 1 when any fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# SpecForge compiles its RMSNorm/RoPE with torch.compile; on CPU they run eagerly.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Filled from the verifier by the library itself, never from the drafter's file.
VERIFIER_FILLED = {"speculators": {"verifier_norm.weight", "verifier_lm_head.weight"}, "sglang": {"embed_tokens.weight"}}


def file_tensors(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


def key_report(model, tensors: dict, layout: str) -> dict:
    """Names the loader did not take, parameters the file did not fill, and tensors whose loaded
    value differs from the file's."""
    import torch

    state = model.state_dict()
    unexpected = sorted(set(tensors) - set(state))
    missing = sorted(set(state) - set(tensors) - VERIFIER_FILLED[layout])
    differ = []
    for k in sorted(set(tensors) & set(state)):
        a, b = tensors[k], state[k]
        if a.shape != b.shape or not torch.equal(a.to(b.dtype) if a.is_floating_point() else a, b):
            differ.append(k)
    return {"unexpected": unexpected, "missing": missing, "differ": differ}


def load_speculators(d: Path, verifier_dir: str):
    import torch
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(d))
    config.speculators_config.verifier.name_or_path = verifier_dir
    # Dense masks: flex attention's block masks want a compiled kernel off GPU.
    config.transformer_layer_config._attn_implementation = "sdpa"  # noqa: SLF001
    return SpeculatorModel.from_pretrained(str(d), config=config, dtype=torch.float32).eval()


def speculators_logits(model, ids, aux, steps: int):
    """speculators' forward on one row: hidden_states [1,T,3H], input_ids the tokens each position's
    features pair with (token t+1 at position t: its data pipeline's alignment), one document."""
    import torch

    shifted = torch.cat([ids[1:], ids.new_zeros(1)])[None]
    seen = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out.detach()))
    try:
        with torch.no_grad():
            model(hidden_states=aux[None], input_ids=shifted, document_ids=torch.zeros_like(shifted), ttt_steps=steps)
    finally:
        hook.remove()
    return torch.stack([s[0] for s in seen])


def load_specforge(d: Path, verifier_dir: str):
    """SpecForge's own warm start of a pretrained draft: the model built from the config by
    AutoDraftModel.from_config (the class the config names, LlamaForCausalLMEagle3), the file's
    tensors loaded by warm_start_draft_model (which refuses unexpected keys and any missing one
    but the embedding), the embedding filled by the model's load_embedding from the target.
    (LlamaForCausalLMEagle3.from_pretrained alone builds on the meta device and leaves its RoPE
    inv_freq buffer uninitialised: measured with transformers 5.8.1 and 5.19, logits off by 0.17.)"""
    import torch
    from specforge.modeling.auto import AutoDraftModel
    from specforge.training.model_loading import warm_start_draft_model
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(d))
    model = AutoDraftModel.from_config(config, torch_dtype=torch.float32)
    report = warm_start_draft_model(model, str(d), draft_config=config, strategy="eagle3", allow_missing_embedding=True)
    model.load_embedding(verifier_dir, embedding_key="model.embed_tokens.weight")
    model.specforge_report = {"loaded_keys": report.loaded_keys, "missing_keys": list(report.missing_keys)}
    return model.eval()


def specforge_logits(model, ids, aux):
    import torch

    shifted = torch.cat([ids[1:], ids.new_zeros(1)])[None]
    with torch.no_grad():
        normed = model(hidden_states=aux[None], inputs_embeds=model.embed_input_ids(shifted), ttt_length=1)
        return model.lm_head(normed)


def compare(ours, theirs) -> dict:
    """Over the positions every reader defines: step i at position t needs token t+1+i."""
    import torch

    steps, t = min(ours.shape[0], theirs.shape[0]), ours.shape[1]
    diffs, agree, total = [], 0, 0
    for i in range(steps):
        n = t - 1 - i
        a, b = ours[i, :n].float(), theirs[i, :n].float()
        diffs.append(float((a - b).abs().max()))
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += n
    return {"steps": steps, "max_abs_diff": max(diffs), "per_step_max_abs_diff": diffs,
            "argmax_agreement": agree / max(1, total)}


def check_case(name: str, case: dict, ref: dict, tensors_ref: dict, atol: float, min_agree: float) -> dict:
    from importlib.metadata import version

    d, layout = Path(case["path"]), case["layout"]
    t0 = time.perf_counter()
    out = {"name": name, "layout": layout, "path": str(d)}
    try:
        tensors = file_tensors(d)
        if layout == "speculators":
            model = load_speculators(d, ref["verifier_dir"])
            out["library"] = f"speculators {version('speculators')}: SpeculatorModel.from_pretrained -> {type(model).__name__}"
            theirs = speculators_logits(model, tensors_ref["input_ids"], tensors_ref["aux"], ref["steps"])
        else:
            model = load_specforge(d, ref["verifier_dir"])
            out["library"] = (f"specforge {version('specforge')}: AutoDraftModel.from_config -> {type(model).__name__}, "
                              "warm_start_draft_model")
            out["specforge_report"] = model.specforge_report
            theirs = specforge_logits(model, tensors_ref["input_ids"], tensors_ref["aux"])
        out["keys"] = key_report(model, tensors, layout)
        out.update(compare(tensors_ref[f"{layout}.logits"], theirs))
    except Exception as e:   # a loader that refuses the export is a failed case, reported
        out["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
    keys = out.get("keys", {})
    out["passed"] = ("error" not in out and not any(keys.values())
                     and out["max_abs_diff"] <= atol and out["argmax_agreement"] >= min_agree)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers
    from safetensors.torch import load_file

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref", type=Path)
    ap.add_argument("--report", type=Path)
    ap.add_argument("--atol", type=float, default=1e-3)
    ap.add_argument("--min-agree", type=float, default=0.99)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ref = json.loads((a.ref / "reference.json").read_text(encoding="utf-8"))
    tensors_ref = load_file(str(a.ref / "reference.safetensors"))
    results = [check_case(n, c, ref, tensors_ref, a.atol, a.min_agree) for n, c in sorted(ref["cases"].items())]
    report = {"torch": torch.__version__, "transformers": transformers.__version__, "atol": a.atol,
              "min_agree": a.min_agree, "cases": results, "seconds": round(time.perf_counter() - t0, 2)}
    if a.report:
        a.report.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for r in results:
        keys = r.get("keys", {})
        print(f"{'ok  ' if r['passed'] else 'FAIL'} {r['name']} ({r['layout']}): {r.get('library', '')}; "
              + (r["error"] if "error" in r else
                 f"unexpected {keys['unexpected'][:4]}, missing {keys['missing'][:4]}, differ {keys['differ'][:4]}; "
                 f"max |dlogit| {r['max_abs_diff']:.2e} over {r['steps']} step(s), argmax agreement "
                 f"{r['argmax_agreement']:.3f}"))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
