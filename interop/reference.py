"""draftgate's side of the interop check, run by the main environment: the exports to check and
draftgate's own forward on fixed inputs, written for interop/check.py (the side environment),
which reads only these files.

    python interop/reference.py OUT [--drafter data/drafter]

With `--drafter` (a train stage's output: sglang/ and speculators/), those exports; without, a
drafter at the embedded target's real sizes (SmolLM2-135M: H 576, 9 heads, 3 KV heads, vocabulary
49,152) with seeded random weights and a draft vocabulary of 512 ids, exported by draftgate's
own export(): loading needs no training, and random weights make every tensor matter.

OUT/reference.json names each export, its layout and the verifier folder (the embedded target's
converted weights: the libraries read the target's embedding and config from it; offline, the
export's hub id cannot be fetched). OUT/reference.safetensors holds the inputs (`input_ids` [T],
`aux` [T, 3*Ht], float32) and, per export, draftgate's logits at each TTT step
(`<layout>.logits` [steps, T, Vd]; a `--case` is held to its layout's) from Eagle3Drafter.ttt on the weights the file holds, with the
embedding that layout's readers use (the target's for SGLang/SpecForge, the shipped one for
speculators).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STEPS = 3          # TTT steps compared (speculators' forward runs them; SpecForge's step 0)
T = 24             # positions of the fixed input


def random_drafter(draft_vocab: int = 512, seed: int = 0):
    """An Eagle3Drafter sized from the embedded target's config, seeded random weights, the target's
    embedding, and a vocabulary map of `draft_vocab` ids spread over the vocabulary."""
    import torch

    from draftgate.drafter.export import target_embedding
    from draftgate.drafter.model import DrafterConfig, Eagle3Drafter
    from draftgate.serve.model import cached_weights

    config = json.loads((Path(cached_weights().path) / "config.json").read_text(encoding="utf-8"))
    n = int(config["num_hidden_layers"])
    c = DrafterConfig.from_target(config, draft_vocab, [1, n // 2 - 1, n - 4])
    torch.manual_seed(seed)
    model = Eagle3Drafter(c, embed_weight=target_embedding({"kind": "embedded"}))
    ids = torch.linspace(0, c.vocab_size - 1, draft_vocab).long()
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    model.set_vocab(ids - torch.arange(draft_vocab), t2d)
    return model.eval()


def export_random(out: Path) -> dict[str, Path]:
    from draftgate.drafter.export import export, verifier_reference

    model = random_drafter()
    verifier = verifier_reference(None, {"kind": "embedded"})
    info = {"target": {"kind": "embedded"}, "interop": "random weights (interop/reference.py)"}
    return {layout: export(model, out / "exports" / layout, layout, info=info, verifier=verifier)
            for layout in ("sglang", "speculators")}


def fixed_inputs(vocab_size: int, target_hidden: int, seed: int = 0):
    """Ids spread over the vocabulary and aux features at the scale of real ones (unit RMS)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (T,), generator=g)
    aux = torch.randn(T, 3 * target_hidden, generator=g)
    return ids, aux


def logits_of(export_dir: Path, layout: str, ids, aux):
    """draftgate's Eagle3Drafter on the file's weights: [steps, T, Vd] (positions past the row's
    end see id 0, as in training; check.py compares the positions every reader defines)."""
    import torch
    from safetensors import safe_open

    from draftgate.drafter.export import WEIGHTS, load_drafter, target_embedding

    embed = target_embedding({"kind": "embedded"})
    if layout == "speculators":
        with safe_open(str(export_dir / WEIGHTS), framework="pt") as f:
            if "embed_tokens.weight" in f.keys():
                embed = f.get_tensor("embed_tokens.weight").float()
    model = load_drafter(export_dir, embed=embed)
    with torch.no_grad():
        hidden = model.ttt(aux[None], ids[None], STEPS)
        return torch.stack([model.logits(h)[0] for h in hidden])


def main(argv: list[str] | None = None) -> int:
    import torch

    from draftgate.drafter.export import read_info
    from draftgate.io import write_safetensors
    from draftgate.serve.model import cached_weights

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--drafter", type=Path, help="a train stage's output folder (sglang/, speculators/)")
    ap.add_argument("--case", action="append", default=[], metavar="NAME=LAYOUT:DIR",
                    help="another export to check against LAYOUT's reference (tests: corrupted copies)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    exports = ({k: a.drafter / k for k in ("sglang", "speculators")} if a.drafter else export_random(a.out))
    cases = {k: (k, d) for k, d in exports.items()}
    for spec in a.case:
        name, rest = spec.split("=", 1)
        layout, d = rest.split(":", 1)
        cases[name] = (layout, Path(d))
    c = read_info(exports["sglang"])["drafter_config"]
    ids, aux = fixed_inputs(int(c["vocab_size"]), int(c["target_hidden_size"]))
    tensors = {"input_ids": ids, "aux": aux}
    for layout, d in exports.items():
        tensors[f"{layout}.logits"] = logits_of(d, layout, ids, aux).contiguous()
    write_safetensors(a.out / "reference.safetensors", tensors, {"format": "pt"})
    ref = {"steps": STEPS, "positions": T, "verifier_dir": str(cached_weights().path),
           "cases": {name: {"layout": layout, "path": str(Path(d).resolve())} for name, (layout, d) in cases.items()}}
    (a.out / "reference.json").write_text(json.dumps(ref, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"reference: {len(cases)} export(s), {T} positions x {STEPS} steps -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
