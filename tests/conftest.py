"""Shared fixtures: the real tokenizers, loaded once per test session.

Built tokenizers are cached under $DRAFTGATE_CACHE (default ~/.cache/draftgate): the first run
builds Qwen3's (~4 s) and converts SmolLM2's GGUF (~4 s); later runs load them in ~1 s and ~0.3 s.
"""

from __future__ import annotations

import os

# Offline by construction: nothing in the tests may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from draftgate.config import TokenizerParams  # noqa: E402


@pytest.fixture(scope="session")
def qwen3_tok():
    from draftgate.tokenizers import load_tokenizer

    return load_tokenizer(TokenizerParams(kind="qwen3"))


@pytest.fixture(scope="session")
def deepseek_tok():
    from draftgate.tokenizers import load_tokenizer

    return load_tokenizer(TokenizerParams(kind="deepseek"))


@pytest.fixture(scope="session")
def smollm2_tok():
    from draftgate.tokenizers import load_tokenizer

    return load_tokenizer(TokenizerParams(kind="smollm2"))


@pytest.fixture(scope="session")
def kimi_standin_tok(qwen3_tok):
    """Qwen3's BPE with Kimi-K2's special tokens at Kimi's real ids (<|im_end|> = 163586, ...)."""
    from standin import kimi_standin

    return kimi_standin(qwen3_tok)
