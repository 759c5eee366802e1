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
# One torch thread per xdist worker (make test runs two on two cores), in every test and every
# process a test starts: a forward's last bits depend on the count, so a test's numbers must not
# depend on which test ran before it in the worker. Stages with a threads param set their own.
os.environ["OMP_NUM_THREADS"] = "1"

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


# The longest files run first. xdist's --dist loadfile hands whole files to the workers in
# collection order: collected in name order, the ~4-minute end-to-end repro started near the end
# and ran on one worker while the other sat idle. Longest first (then the rest in name order) leaves
# only short files for the end, where one worker finishing before the other costs little. The
# order is by the durations `make test` prints, heaviest first; a file missing here is only late.
# xdist would re-sort the files by their number of tests: the Makefile passes --no-loadscope-reorder.
FIRST = ("test_pipeline.py", "test_eval_gate.py", "test_pipeline_stops.py", "test_serve.py", "test_eval_loop.py",
         "test_repair_search.py", "test_drafter_train.py", "test_hidden_dist.py", "test_lineage_experiments.py",
         "test_interop.py", "test_interop_data.py", "test_stage_generate.py", "test_hidden_shards.py",
         "test_hidden_gate.py", "test_tokenizers.py")


def pytest_collection_modifyitems(items):
    rank = {name: k for k, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))   # stable: the rest keep their order
