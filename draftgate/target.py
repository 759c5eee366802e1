"""The target model whose hidden states a drafter learns from.

Two kinds (`hidden.kind`):
- `embedded`: the SmolLM2 weights the local server generated the responses with. They are the
  very cache entry draftgate/serve/model.py converts from the GGUF (`cached_weights`), so the
  fingerprint recorded here is the one the server reported; `check_served` proves it against the
  responses' request hashes (docs/hidden-states.md, "Which weights").
- `hf_dir`: any HF causal-LM directory; its fingerprint is a sha256 over its weight files.

Only the decoder stack runs during capture (`model.model`), never the LM head over the whole
vocabulary: `logits_from_final` applies the final norm and the head where a check needs logits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from draftgate.config import HiddenParams

DTYPES = ("float32", "bfloat16", "float16")
EMBEDDED_PREFIX = "embedded:"    # identity["path"] of the embedded target: a name, not a folder


class TargetError(ValueError):
    """A target that cannot be loaded, or is not the model the data came from."""


@dataclass
class Target:
    model: Any                     # HF causal LM, eval mode, on `device`
    config: Any
    kind: str
    path: str                      # the weights' folder
    device: str
    compute_dtype: str
    weights_fingerprint: str
    tokenizer_fingerprint: str
    chat_template_sha256: str

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def base(self) -> Any:
        """The decoder stack without the LM head (LlamaModel for Llama-family targets)."""
        return self.model.get_decoder()

    @property
    def layers(self) -> Any:
        return self.base.layers

    @property
    def norm(self) -> Any:
        return self.base.norm

    @property
    def lm_head(self) -> Any:
        return self.model.get_output_embeddings()

    @property
    def embed_tokens(self) -> Any:
        return self.model.get_input_embeddings()

    def logits_from_final(self, final: Any) -> Any:
        """Logits (float32) from stored final states taken BEFORE the final norm."""
        import torch

        param = next(self.norm.parameters())
        with torch.inference_mode():
            h = final.to(device=param.device, dtype=param.dtype)
            return self.lm_head(self.norm(h)).float()

    @property
    def config_sha256(self) -> str:
        d = self.config.to_dict()
        for k in ("_name_or_path", "transformers_version", "dtype", "torch_dtype"):
            d.pop(k, None)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def reference(self) -> str:
        """The weights named the same way on every machine: hf_dir's path as hidden.path gives it;
        for embedded, the served model's name. The embedded folder is a cache entry under the
        user's home: recorded in the manifest, it made data/hidden (and the drafter's exports, which
        copy it) differ in bytes between machines with equal weights."""
        if self.kind == "embedded":
            from draftgate.serve.model import SERVED_NAME

            return f"{EMBEDDED_PREFIX}{SERVED_NAME}"
        return self.path

    @property
    def identity(self) -> dict[str, Any]:
        """The manifest's `model` object (docs/hidden-states.md)."""
        return {"kind": self.kind, "path": self.reference, "weights_fingerprint": self.weights_fingerprint,
                "config_sha256": self.config_sha256, "num_hidden_layers": self.num_layers,
                "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
                "compute_dtype": self.compute_dtype}

    @property
    def served_identity(self) -> dict[str, str]:
        """What the local server reports as its identity (draftgate/serve/model.py), less the device."""
        return {"weights": self.weights_fingerprint, "tokenizer": self.tokenizer_fingerprint,
                "chat_template": self.chat_template_sha256}


def load_target(hidden_params: HiddenParams, device: str | None = None, param: str = "hidden.device") -> Target:
    """Load the target of `hidden_params` on `device` (default: the params' own, "auto" = CUDA
    when present); `param` names the key that chose the device, for the error."""
    import torch

    from draftgate.device import resolve_device

    dev = resolve_device(device or hidden_params.device, param if device else "hidden.device")
    dtype = getattr(torch, hidden_params.compute_dtype)

    def weights(path: Path) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                    trust_remote_code=hidden_params.trust_remote_code)

    model, path, weights_fp, tok_fp, template = _resolve(hidden_params, weights)
    model.eval().requires_grad_(False).to(dev)
    return Target(model=model, config=model.config, kind=hidden_params.kind, path=path, device=dev,
                  compute_dtype=hidden_params.compute_dtype, weights_fingerprint=weights_fp,
                  tokenizer_fingerprint=tok_fp,
                  chat_template_sha256=hashlib.sha256(template.encode("utf-8")).hexdigest())


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default auxiliary layers: [1, N//2 - 1, N - 4] (SmolLM2, N=30: [1, 14, 26])."""
    if num_layers < 5:
        raise ValueError(f"a target with {num_layers} layers is too shallow for EAGLE-3's [1, N//2-1, N-4]")
    return (1, num_layers // 2 - 1, num_layers - 4)


def resolve_layers(layers: Sequence[int] | None, num_layers: int) -> tuple[int, int, int]:
    """`hidden.layers` checked against the target (null = the EAGLE-3 default)."""
    if layers is None:
        return eagle3_layers(num_layers)
    out = tuple(int(i) for i in layers)
    if len(out) != 3 or any(not 0 <= i < num_layers for i in out):
        raise ValueError(f"hidden.layers {list(out)}: need 3 decoder-layer ids in [0, {num_layers - 1}] "
                         f"(0-based; the target has {num_layers} layers); null takes [1, N//2-1, N-4]")
    return out  # type: ignore[return-value]


@contextlib.contextmanager
def capturing(decoder: Any, layers: Sequence[int], batch: int, width: int, dtype: Any) -> Iterator[tuple[Any, Any]]:
    """The EAGLE-3 features of whatever forward of `decoder` (the stack without the LM head) runs
    inside: aux [batch, width, len(layers), H] (the outputs of decoder blocks `layers`, 0-based)
    and final [batch, width, H] (the last block's output, BEFORE the final norm), stored in
    `dtype` by forward hooks as the blocks run. One definition of the features for the hidden
    stage's capture and the repair stage's base pass (docs/repair.md, "One prefill")."""
    import torch

    blocks = decoder.layers
    param = next(decoder.parameters())
    h = int(decoder.config.hidden_size)
    aux = torch.empty((batch, width, len(layers), h), dtype=dtype, device=param.device)
    final = torch.empty((batch, width, h), dtype=dtype, device=param.device)

    def store(dest: Any) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            dest.copy_(output[0] if isinstance(output, tuple) else output)
        return hook

    handles = [blocks[i].register_forward_hook(store(aux[:, :, j])) for j, i in enumerate(layers)]
    handles.append(blocks[len(blocks) - 1].register_forward_hook(store(final)))
    try:
        yield aux, final
    finally:
        for handle in handles:
            handle.remove()


def check_layers(layers: list[int] | None, config_path: Path) -> None:
    """hidden.layers against the target's decoder layers, read from its config.json before any
    weight is loaded (a large target's load takes minutes; hidden/capture.py checks again, with
    the loaded model). A config without the count leaves it to that later check."""
    if layers is None:
        return
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TargetError(f"{config_path}: unreadable ({e}); the target's config.json is needed") from None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    n = config.get("num_hidden_layers", text.get("num_hidden_layers"))
    if not isinstance(n, int):
        return
    bad = [i for i in layers if not 0 <= i < n]
    if bad:
        raise TargetError(f"hidden.layers {list(layers)}: layer {bad[0]} is past the target's {n} decoder layers "
                          f"(0-based ids 0..{n - 1}; num_hidden_layers in {config_path}); null takes "
                          "EAGLE-3's [1, N//2-1, N-4]")


def describe_target(hidden_params: HiddenParams) -> Target:
    """The target of `hidden_params` without its weights in memory (`model` None): the config,
    fingerprints and template, for a backend whose engine loads the weights itself
    (hidden.backend: vllm). Its `config_sha256` equals load_target's (the same config.json)."""
    from transformers import AutoConfig

    def config_only(path: Path) -> Any:
        return AutoConfig.from_pretrained(path, trust_remote_code=hidden_params.trust_remote_code)

    config, path, weights_fp, tok_fp, template = _resolve(hidden_params, config_only)
    return Target(model=None, config=config, kind=hidden_params.kind, path=path, device="engine",
                  compute_dtype=hidden_params.compute_dtype, weights_fingerprint=weights_fp,
                  tokenizer_fingerprint=tok_fp,
                  chat_template_sha256=hashlib.sha256(template.encode("utf-8")).hexdigest())


def _resolve(hp: HiddenParams, load: Any) -> tuple[Any, str, str, str, str]:
    """`load(weights folder)` (the model, or only its config) and the target's fingerprints."""
    from draftgate.serve.model import _quiet_transformers

    _quiet_transformers()
    if hp.kind == "embedded":
        from draftgate.serve.model import cached_weights, smollm2_tokenizer

        # The same entry, the same loader and the same tokenizer object the server uses (load()):
        # its fingerprint is the server's `identity["weights"]`.
        weights = cached_weights()
        check_layers(hp.layers, weights.path / "config.json")
        tok = smollm2_tokenizer()
        return load(weights.path), str(weights.path), weights.fingerprint, tok.fingerprint, tok.hf.chat_template or ""
    from draftgate.config import TokenizerParams
    from draftgate.tokenizers import load_tokenizer

    path = Path(hp.path or "")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise TargetError(f"hidden.path {hp.path!r} is not an HF model directory (no config.json); "
                          "point it at the folder save_pretrained wrote, or use kind: embedded")
    files = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files:
        raise TargetError(f"{path}: no *.safetensors or *.bin weight files")
    check_layers(hp.layers, path / "config.json")
    loaded = load(path)
    tok = load_tokenizer(TokenizerParams(kind="hf_dir", path=str(path), trust_remote_code=hp.trust_remote_code))
    return loaded, str(path), weights_fingerprint(files), tok.fingerprint, tok.hf.chat_template or ""


def weights_fingerprint(files: list[Path]) -> str:
    """sha256 over `name:sha256` of each weight file (the cache's fingerprint recipe)."""
    from draftgate import cache

    return cache.fingerprint({p.name: cache.file_sha256(p) for p in files})


# ---------------------------------------------------------------- the served weights

def check_served(target: Target, responses: Path, prompts: Path, generate_params: Any,
                 sample: int = 64) -> dict[str, Any]:
    """Prove the responses were generated by these weights (and tokenizer and template).

    The local server hashes its identity into every request hash (client/request.py), so the hash
    recomputed from the prompt, the generate params and this target's identity must equal the
    stored one for the first `sample` ok rows. Returns what was checked; raises TargetError when
    a row's hash names another identity.
    """
    import pyarrow.parquet as pq

    from draftgate.client.request import build_body, prompt_from_row, request_hash

    wanted: dict[str, str] = {}
    for batch in pq.ParquetFile(responses).iter_batches(columns=["prompt_id", "request_hash", "status"]):
        for r in batch.to_pylist():
            if r["status"] == "ok" and len(wanted) < sample:
                wanted[r["prompt_id"]] = r["request_hash"]
        if len(wanted) >= sample:
            break
    if not wanted:
        return {"checked": 0, "legacy": 0}
    found = {}
    for batch in pq.ParquetFile(prompts).iter_batches():
        for r in batch.to_pylist():
            if r["prompt_id"] in wanted:
                found[r["prompt_id"]] = prompt_from_row(r, f"{prompts}")
    legacy, bad = 0, []
    for pid, stored in wanted.items():
        if pid not in found:
            raise TargetError(f"{responses}: prompt {pid} is not in {prompts}; rerun generate")
        body = build_body(found[pid], generate_params)
        if any(request_hash(body, generate_params.backend, {**target.served_identity, "device": d}) == stored
               for d in ("cpu", "cuda")):
            continue
        if request_hash(body, generate_params.backend, None) == stored:
            legacy += 1
        else:
            bad.append(pid)
    if bad or legacy:
        raise TargetError(
            f"{responses}: {len(bad) + legacy} of {len(wanted)} checked responses were not served by these "
            f"weights (fingerprint {target.weights_fingerprint[:16]}, tokenizer "
            f"{target.tokenizer_fingerprint[:16]})"
            + (f"; {legacy} predate recorded server identities" if legacy else "")
            + ": the hidden states would not belong to the tokens. Rerun generate with this model "
              "(dvc repro generate), or set hidden.check_served: false if the mismatch is intended")
    return {"checked": len(wanted), "legacy": 0}
