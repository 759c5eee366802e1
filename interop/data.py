"""Training data in and out of SpecForge and speculators, run by the side environment's Python
(make interop); nothing of draftgate is imported here (docs/interop.md, "Hidden states and data").

    .venv-interop/bin/python interop/data.py [--write-specforge SRC OUT] [--load EXPORT OUT]

Both in one call when given both (one interpreter start: the test pays the imports once).

    --write-specforge SRC OUT
        SpecForge's own writer: each SRC/sample_<i>.safetensors (input_ids, loss_mask, hidden_state
        [1,T,H], aux_hidden_state [1,T,3H]) put into a LocalFeatureStore whose dump folder is
        OUT/rows_0-5000, which torch.saves `data_<i>.ckpt` (the layout of prepare_hidden_states.py);
        then read back by its OfflineManifestReader to prove the files are its own.
    --load EXPORT OUT
        draftgate's export (stages/export_data.py) read by each library's training loaders:
        SpecForge: build_offline_eagle3_dataset (OfflineEagle3Dataset) per item, the
        OfflineManifestReader + LocalFeatureStore + eagle3 normaliser path, DataCollatorWithPadding
        over every item, and vocab_mapping.pt through LlamaForCausalLMEagle3.load_vocab_mapping;
        speculators: ArrowDataset per item, create_train_val_loaders (its packing loader, no
        workers) over both splits, and the d2t/t2d files where its train CLI looks
        (parse_vocab_mappings with only --data-path and --draft-vocab-size).
        OUT/loaded.safetensors holds every tensor as the loaders returned it, OUT/report.json the
        shapes, counts and versions: the test compares them with what draftgate meant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def write_specforge(src: Path, out: Path) -> dict:
    from safetensors.torch import load_file
    from specforge.runtime.data_plane.feature_store import LocalFeatureStore
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader

    dump = out / "rows_0-5000"
    store = LocalFeatureStore(dump_dir=str(dump))
    files = sorted(src.glob("sample_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
    for p in files:
        i = int(p.stem.split("_")[1])
        ref = store.put(load_file(str(p)), sample_id=f"data_{i}", metadata={"strategy": "eagle3"})
        store.abort(ref.sample_id)      # the dump on disk is what we want; free the resident copy
    refs = OfflineManifestReader(str(out), validate_files=True).read()
    return {"written": len(files), "read_back": len(refs), "keys": sorted(refs[0].feature_keys) if refs else []}


def load_specforge(d: Path, info: dict, tensors: dict) -> dict:
    import torch
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.data.preprocessing import build_offline_eagle3_dataset
    from specforge.data.utils import DataCollatorWithPadding
    from specforge.runtime.data_plane.feature_store import LocalFeatureStore
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader

    hs = d / "hidden_states"
    max_len = max(info["lengths"]) + 1
    dataset = build_offline_eagle3_dataset(str(hs), max_len=max_len)
    items = [dataset[i] for i in range(len(dataset))]
    for i, item in enumerate(items):
        for k, v in item.items():
            tensors[f"specforge.{i}.{k}"] = v.contiguous()
    # The runtime path (the trainer's feature loader): reader -> store -> the eagle3 normaliser.
    store = LocalFeatureStore()
    same = True
    refs = OfflineManifestReader(str(hs), max_len=max_len).read()
    for i, ref in enumerate(refs):
        raw, handle = store.get(ref)
        norm = normalize_offline_sample(raw, max_len)
        store.release(handle)
        same &= all(torch.equal(norm[k], items[i][k]) for k in norm)
    batch = DataCollatorWithPadding()(items)
    # The vocabulary map, through the draft model's own loader (its buffers are d2t [Vd], t2d [V]).
    from specforge.modeling.auto import AutoDraftModel
    from transformers import LlamaConfig

    h = info["hidden_size"]
    config = LlamaConfig(architectures=["LlamaForCausalLMEagle3"], hidden_size=h, intermediate_size=64,
                         num_attention_heads=h // 64, num_key_value_heads=h // 64, head_dim=64,
                         num_hidden_layers=1, vocab_size=info["vocab_size"], draft_vocab_size=info["draft_vocab_size"],
                         max_position_embeddings=max_len, rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = AutoDraftModel.from_config(config, torch_dtype=torch.float32)
    model.load_vocab_mapping(str(d / "vocab_mapping.pt"))
    tensors["specforge.d2t"], tensors["specforge.t2d"] = model.d2t.clone(), model.t2d.clone()
    return {"library": f"specforge {version('specforge')}", "items": len(items), "files": len(dataset.datapaths),
            "reader_matches_dataset": bool(same), "refs": len(refs),
            "batch": {k: list(v.shape) for k, v in batch.items() if hasattr(v, "shape")},
            "draft_model": type(model).__name__, "vocab_mapping_loaded": bool(model.vocab_mapping_loaded)}


def load_speculators(d: Path, info: dict, tensors: dict) -> dict:
    import torch
    from speculators.train.cli import parse_vocab_mappings
    from speculators.train.data import ArrowDataset
    from speculators.train.dataloader import create_train_val_loaders

    max_len = max(info["lengths"]) + 1
    dataset = ArrowDataset(max_len=max_len, datapath=str(d), on_missing="raise")
    for i in range(len(dataset)):
        item = dataset[i]
        if not isinstance(item, dict):
            raise SystemExit(f"speculators: sample {i} unavailable: {getattr(item, 'reason', item)}")
        for k, v in item.items():
            tensors[f"speculators.{i}.{k}"] = v.contiguous()
    train, val = create_train_val_loaders(
        data_path=str(d), total_seq_len=sum(info["lengths"]), hidden_states_dtype=torch.bfloat16,
        vllm_endpoint="http://127.0.0.1:9/v1", on_missing="raise", verifier_name_or_path="unused",
        request_timeout=1.0, max_retries=0, generation_validation_retries=0, max_consecutive_generation_failures=1,
        hidden_size=info["hidden_size"], num_target_layers=3, num_workers=0, prefetch_factor=1, preprocess=None,
        train_data_ratio=0.5)
    tokens = 0
    shapes = {}
    for loader in (train, val):
        for batch in loader:
            tokens += int((batch["document_ids"] >= 0).sum())
            shapes = {k: list(v.shape) for k, v in batch.items() if hasattr(v, "shape")}
    args = argparse.Namespace(d2t_path=None, t2d_path=None, data_path=str(d), draft_vocab_size=info["draft_vocab_size"],
                              token_freq_path=None, verifier_name_or_path=None, trust_remote_code=False)
    d2t, t2d, size = parse_vocab_mappings(args)
    tensors["speculators.d2t"], tensors["speculators.t2d"] = d2t.contiguous(), t2d.contiguous()
    return {"library": f"speculators {version('speculators')}", "items": len(dataset),
            "loader_tokens": tokens, "batch": shapes, "draft_vocab_size": int(size)}


def load(export: Path, out: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    doc = json.loads((export / "export.json").read_text(encoding="utf-8"))
    info = {"lengths": doc["lengths"], "hidden_size": doc["hidden_size"],
            "vocab_size": doc["draft_vocab"]["target_vocab_size"], "draft_vocab_size": doc["draft_vocab"]["size"]}
    tensors: dict = {}
    report: dict = {"torch": torch.__version__}
    for name, fn in (("specforge", load_specforge), ("speculators", load_speculators)):
        if (export / name).is_dir():
            t0 = time.perf_counter()
            report[name] = fn(export / name, info, tensors)
            report[name]["seconds"] = round(time.perf_counter() - t0, 2)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "loaded.safetensors"))
    return report


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-specforge", nargs=2, type=Path, metavar=("SRC", "OUT"))
    ap.add_argument("--load", nargs=2, type=Path, metavar=("EXPORT", "OUT"))
    a = ap.parse_args(argv)
    if not (a.write_specforge or a.load):
        ap.error("give --write-specforge SRC OUT, --load EXPORT OUT, or both")
    torch.set_num_threads(1)
    report = {}
    if a.write_specforge:
        report["write_specforge"] = write_specforge(*a.write_specforge)
    if a.load:
        report["load"] = load(*a.load)
        (a.load[1] / "report.json").write_text(json.dumps(report["load"], indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
