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
# Nor may DVC: a repo the tests init has no `core.analytics false` yet, and each dvc call there
# would start an analytics daemon beside it.
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
# One torch thread per xdist worker (make test runs two on two cores), in every test and every
# process a test starts: a forward's last bits depend on the count, so a test's numbers must not
# depend on which test ran before it in the worker. Stages with a threads param set their own.
os.environ["OMP_NUM_THREADS"] = "1"
# The tests that must run torch on two threads (a stage's threads param) still share the two cores
# with the other worker: OpenMP's idle threads then spin on a core another process needs. Passive
# waiting changes no result, only the spin: two 2-thread forward loops side by side took 32 s with
# the default policy and 11 s passive (one alone: 6.3 s and 7.2 s). libgomp reads it when torch
# loads, so it is set before anything imports torch here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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


# The heaviest files first, longest first (seconds of pytest each under make test, read from its
# --junitxml on 2 cores, 2026-12-06: 211, 66, 65, 63, 59, 53, 50, 49, 41, 35, 35, 31). make test
# runs `--dist loadfile --no-loadscope-reorder`: each worker takes the next file when it runs dry,
# in this order. xdist's own order (most tests first) left the one-test engine files for last:
# the wall time over half the summed durations went from 33 s to 21 s with this order (junit of
# two make test runs). Only the order changes, never what runs; a file missing from the list runs
# after these, in collection order.
HEAVY_FIRST = ("test_pipeline.py", "test_engine_vllm.py", "test_serve.py", "test_engine_eval.py",
               "test_eval_loop.py", "test_eval_gate.py", "test_drafter_train.py",
               "test_hidden_shards.py", "test_tokenizers.py", "test_repair_search.py", "test_prefill.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))    # stable: file order kept within
