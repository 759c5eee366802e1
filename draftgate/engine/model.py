"""The embedded default (SmolLM2-135M-Instruct) as a directory vLLM can serve.

The converted weights' cache entry (serve/model.py `cached_weights`) holds config.json and
model.safetensors but no tokenizer: the local server loads draftgate's own tokenizer build
(tokenizers/smollm2.py, the digit-isolating pre-tokenizer restored, and its chat template). vLLM
reads both from the model directory, so this entry puts them together: the weights' files
hard-linked (copied across file systems), the tokenizer entry's files copied beside them. It is a
cache entry of its own (draftgate.cache: atomic, keyed by both entries' fingerprints and this
recipe, re-checked on each load), so the served prompt is rendered by exactly the template and
tokenizer draftgate renders with; the engine tests hold the served `prompt_token_ids` equal to ours.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from draftgate import cache

SERVED_NAME = "smollm2-135m-instruct"   # the local server's name, so generate.model fits both


def servable_dir(cache_root: Path | None = None) -> cache.Entry:
    """The cache entry `smollm2-135m-instruct-vllm-<key>`: weights + tokenizer + chat template."""
    from draftgate.serve.model import cached_weights
    from draftgate.tokenizers import load_smollm2

    weights = cached_weights(cache_root)
    tokenizer = load_smollm2()
    tok_dir = Path(tokenizer.hf.name_or_path)
    key = cache.key(weights.fingerprint, tokenizer.fingerprint, cache.recipe(__name__, "assemble"))
    return cache.entry("smollm2-135m-instruct-vllm", key, lambda folder: assemble(weights.path, tok_dir, folder),
                       inputs={"weights": weights.fingerprint, "tokenizer": tokenizer.fingerprint},
                       cache_root=cache_root)


def assemble(weights: Path, tokenizer: Path, folder: Path) -> None:
    """Weights (hard links: 538 MB shared, not copied) and tokenizer files into one folder."""
    for src_dir, kind in ((weights, "weights"), (tokenizer, "tokenizer")):
        # The entries' content only: each has its own manifest and stat stamp, which are not files
        # of the model (two stamps collided here on a fresh cache).
        for name, src in cache.contents(src_dir).items():
            if "/" in name:
                continue        # vLLM reads the model folder's top level; both entries are flat
            dst = folder / name
            if dst.exists():
                raise RuntimeError(f"{src} ({kind}) would overwrite {dst.name} from the other entry; "
                                   "the weights and tokenizer entries must not share file names")
            try:
                os.link(src, dst)
            except OSError:   # another file system, or links not allowed: copy
                shutil.copyfile(src, dst)
