"""A Kimi-K2-shaped stand-in tokenizer for tests: Kimi's real tokenizer files can't be fetched here.

Test code, not library code: it is the one place that writes Kimi's special ids as literals, to
place them where the real tokenizer has them (docs/tokenizers.md; the real tokenizer_config is the authority).
"""

from __future__ import annotations

import json

from pathlib import Path

from draftgate import cache
from draftgate import tokenizers as tk
from draftgate.tokenizers import ranks

# Kimi-K2 / K2.5 special tokens at their real ids (docs/tokenizers.md; the tokenizer_config of the real
# model is the authority, the stand-in only mirrors it). Kimi reserves 256 ids after its BPE ranks.
KIMI_FIRST_SPECIAL_ID = 163584
KIMI_N_SPECIAL = 256
KIMI_SPECIALS = {
    "[BOS]": 163584, "[EOS]": 163585, "<|im_end|>": 163586, "<|im_user|>": 163587,
    "<|im_assistant|>": 163588, "[EOT]": 163593, "<|im_system|>": 163594,
    "<|tool_calls_section_begin|>": 163595, "<|tool_calls_section_end|>": 163596,
    "<|tool_call_begin|>": 163597, "<|tool_call_argument_begin|>": 163598,
    "<|tool_call_end|>": 163599, "<|im_middle|>": 163601, "<think>": 163606, "</think>": 163607,
}


def kimi_standin(base: tk.Tokenizer) -> tk.Tokenizer:
    """Qwen3's real BPE (ranks, regex, NFC) with Kimi-K2's special tokens at Kimi's real ids.

    Ids between Qwen3's last rank and Kimi's first special id are ordinary filler pieces that no
    text can produce (like real Kimi, an id such as 163533 is an ordinary token there: "chas" on
    Kimi, "<kimi-standin-163533>" here). The 256 reserved ids are special added tokens: Kimi's
    names where docs/tokenizers.md lists them, <|reserved_token_N|> elsewhere. Not a pipeline kind: nothing
    real is ever tokenized with it.
    """
    if base.kind != "qwen3":
        raise tk.TokenizerError(f"kimi_standin needs the qwen3 tokenizer as its base, got {base.kind}")
    ranks_path, pattern, _ = tk.qwen3_sources()
    by_id = {i: n for n, i in KIMI_SPECIALS.items()}
    added = [(i, by_id.get(i, f"<|reserved_token_{i - KIMI_FIRST_SPECIAL_ID}|>"), True)
             for i in range(KIMI_FIRST_SPECIAL_ID, KIMI_FIRST_SPECIAL_ID + KIMI_N_SPECIAL)]
    key = cache.key(cache.file_sha256(ranks_path), pattern, json.dumps(added), tk.versions(),
                    cache.recipe("standin", "kimi_standin") + cache.recipe(ranks.__name__, "build_from_ranks"))

    def build(folder: Path) -> None:
        table = ranks._load_ranks(ranks_path)
        fillers = {f"<kimi-standin-{i}>": i for i in range(len(table), KIMI_FIRST_SPECIAL_ID)}
        tk.build_from_ranks(table, pattern, nfc=True, added=added, fillers=fillers).save(
            str(folder / "tokenizer.json"))

    entry = cache.entry("kimi_standin", key, build)
    from transformers import PreTrainedTokenizerFast

    tok = tk.Tokenizer(PreTrainedTokenizerFast(tokenizer_file=str(entry.path / "tokenizer.json")), "kimi_standin",
                    tiktoken_core=lambda: base._tiktoken_encoding)
    ranks._check_ids(tok, [(i, n) for n, i in KIMI_SPECIALS.items()])
    return tok
