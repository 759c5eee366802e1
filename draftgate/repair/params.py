"""The `repair` section of params.yaml, in config.py's style (ranges inside the types): the
integrator moves `RepairParams` into draftgate/config.py and adds `repair` to its sections.

Figures behind the defaults are in docs/repair.md ("Defaults").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from draftgate.config import Fraction, Positive, Range


@dataclass(frozen=True)
class RepairParams:
    # hf: the target in process (hidden.kind / hidden.path: the same weights the hidden stage
    # loads); vllm: any vLLM server, or `draftgate serve` (/v1/completions with prompt_logprobs);
    # sglang: SGLang's native /generate. off: the stage copies the tokens table unchanged.
    backend: Literal["hf", "vllm", "sglang", "off"] = "hf"
    base_url: str | None = None
    model: str | None = None                  # the served name (vllm); null = the server's only one
    top_logprobs: Annotated[int, Range(ge=1, le=20)] = 20    # HTTP backends: raw top-k per position
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Sampling the rows were drawn with: null takes generate's (temperature, top_p); top_k 0 = off.
    temperature: Annotated[float, Range(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Range(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Range(ge=0)] = 0
    # Search (search.py): a token the canonical prefix gives less than min_branch_prob (at the
    # sampling temperature, inside the nucleus) is not branched into.
    min_branch_prob: Fraction = 0.01
    # ... unless it has at least min_branch_ratio of the canonical token's probability: where the
    # model is unsure (the canonical token itself at 0.016), a sampled split can be at 0.006.
    min_branch_ratio: Fraction = 0.1
    window_tokens: Annotated[int, Range(ge=1, le=16)] = 4     # tokens of a candidate window
    window_candidates: Positive = 16          # windows per branch point (a whitespace run's cap)
    row_candidates: Positive = 512            # windows scored per row; past it: reason `budget`
    rejoin_tokens: Annotated[int, Range(ge=0, le=8)] = 1       # canonical tokens scored after a window
    max_length_delta: Annotated[int, Range(ge=1, le=64)] = 8  # |billed - canonical| searched
    # A choice whose log-likelihood beats the runner-up by less than this (nats) is `ambiguous`:
    # the row keeps its ids.
    ambiguous_margin: Annotated[float, Range(ge=0.0)] = 1.0
    # Passes: each re-searches around the previous choice (edits that pay only together).
    passes: Annotated[int, Range(ge=1, le=8)] = 3
    branch_tokens: Positive = 1024            # HF: branch tokens per tree-masked forward
