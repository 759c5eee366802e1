"""The EAGLE-3 drafter: one Llama decoder layer over [token embedding, fused target features].

Layout and names follow what SGLang and vLLM load (docs/drafter.md, "Architecture"):

    fc                      Linear(3 x target_hidden -> H): fuses the three aux features
    embed_tokens            the target's embedding, frozen (both engines share the target's)
    midlayer.input_layernorm    RMSNorm of the token embedding
    midlayer.hidden_norm        RMSNorm of the fused hidden state
    midlayer.self_attn.{q,k,v}_proj   input 2H: [normed embedding, normed hidden] concatenated
    midlayer.self_attn.o_proj, midlayer.post_attention_layernorm, midlayer.mlp.{gate,up,down}_proj
    norm, lm_head           final RMSNorm, head over the draft vocabulary
    d2t, t2d                the draft vocabulary map (draftgate/drafter/vocab.py)

The residual around attention is the fused hidden state before its norm (SGLang's layer, and
vLLM's with `norm_before_residual: false`). The layer's output before `norm` is the hidden
state fed back at the next step.

Alignment (docs/drafter.md, "Alignment"): position t pairs the target's aux features at t with
the embedding of token t+1 and predicts token t+2. Training-time test step i at position t feeds
the drafter's own step-(i-1) output and the embedding of token t+1+i, at RoPE position t+i; its
query sees the step-0 keys of positions <= t and the keys steps 1..i made at position t. That
is exactly what drafting a chain at inference does at the last position, which `propose` runs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int                 # the target's
    draft_vocab_size: int
    target_hidden_size: int
    max_position_embeddings: int
    hidden_act: str
    rope_parameters: dict[str, Any]  # the target's RoPE (rope_type, rope_theta, scaling fields)
    aux_layers: tuple[int, ...]     # 0-based decoder-layer outputs of the target (EAGLE-3 convention)
    target_num_layers: int
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_target(cls, target_config: Any, draft_vocab_size: int, aux_layers: Any) -> "DrafterConfig":
        """Sizes and RoPE from the target's HF config (an object or a dict)."""
        c = target_config if isinstance(target_config, dict) else target_config.to_dict()
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        layers = tuple(int(x) for x in aux_layers)
        if len(layers) != 3:
            raise ValueError(f"EAGLE-3 fuses exactly 3 aux layers, got {list(layers)}")
        return cls(hidden_size=hidden, intermediate_size=int(c["intermediate_size"]),
                   num_attention_heads=heads, num_key_value_heads=int(c.get("num_key_value_heads") or heads),
                   head_dim=int(c.get("head_dim") or hidden // heads), rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
                   vocab_size=int(c["vocab_size"]), draft_vocab_size=int(draft_vocab_size),
                   target_hidden_size=hidden, max_position_embeddings=int(c.get("max_position_embeddings", 8192)),
                   hidden_act=str(c.get("hidden_act", "silu")), rope_parameters=_rope_of(c),
                   aux_layers=layers, target_num_layers=int(c["num_hidden_layers"]))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aux_layers"] = list(self.aux_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DrafterConfig":
        d = dict(d)
        d["aux_layers"] = tuple(d["aux_layers"])
        return cls(**d)

    def llama_config(self) -> Any:
        """A transformers LlamaConfig of the same layer, for RoPE (every rope_type it knows)."""
        from transformers import LlamaConfig

        return LlamaConfig(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                           num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                           max_position_embeddings=self.max_position_embeddings,
                           rms_norm_eps=self.rms_norm_eps, vocab_size=self.vocab_size,
                           rope_parameters=dict(self.rope_parameters), num_hidden_layers=1)


def _rope_of(c: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 keeps RoPE in `rope_parameters`; older configs in rope_theta + rope_scaling."""
    rp = c.get("rope_parameters")
    if isinstance(rp, dict) and "rope_theta" in rp:
        return {"rope_type": rp.get("rope_type", "default"), **rp}
    rope = {"rope_type": "default", "rope_theta": float(c.get("rope_theta", 10000.0))}
    scaling = c.get("rope_scaling")
    if isinstance(scaling, dict):
        rope.update(scaling)
        rope["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    return rope


class Attention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [B,h,T,d], k and v [B,h,T,d] (KV heads repeated for grouped-query attention)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        groups = self.heads // self.kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return q, k, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        b, h, t, d = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, h * d))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rot * sin[:, None]


class MLP(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        from transformers.activations import ACT2FN

        self.act = ACT2FN[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.mlp = MLP(c)

    def inputs(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = residual + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Drafter(nn.Module):
    def __init__(self, config: DrafterConfig, embed_weight: torch.Tensor | None = None):
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        if embed_weight is not None:
            if tuple(embed_weight.shape) != (c.vocab_size, c.hidden_size):
                raise ValueError(f"target embedding is {tuple(embed_weight.shape)}, the drafter needs "
                                 f"{(c.vocab_size, c.hidden_size)}")
            with torch.no_grad():
                self.embed_tokens.weight.copy_(embed_weight)
        self.embed_tokens.weight.requires_grad_(False)   # the target's, frozen
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.rotary = LlamaRotaryEmbedding(c.llama_config())

    # ------------------------------------------------------------ pieces

    def set_vocab(self, d2t: Any, t2d: Any) -> None:
        with torch.no_grad():
            self.d2t.copy_(torch.as_tensor(d2t, dtype=torch.int64))
            self.t2d.copy_(torch.as_tensor(t2d, dtype=torch.bool))

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Every tensor but the frozen target embedding."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("embed_tokens.")}

    def _rope(self, positions: torch.Tensor, like: torch.Tensor):
        cos, sin = self.rotary(like, positions)
        return cos, sin

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [..., 3, Ht] or [..., 3*Ht] -> [..., H] (in the drafter's dtype)."""
        if aux.dim() >= 2 and aux.shape[-2] == 3 and aux.shape[-1] == self.config.target_hidden_size:
            aux = aux.flatten(-2)
        return self.fc(aux.to(self.fc.weight.dtype))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits from a pre-norm hidden state."""
        return self.lm_head(self.norm(hidden))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    # ------------------------------------------------------------ training-time test

    def ttt(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int,
            query_pos: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Pre-norm hidden states of every TTT step (see the module docstring).

        aux [B,T,3,Ht] (or [B,T,3Ht]), input_ids [B,T] right-padded. Step i at position t takes
        the embedding of token t+1+i (id 0 past the row's end: those positions carry no loss).
        `query_pos` [B,S] (ascending per row; repeats allowed as padding) limits the work to the
        positions some step's loss reads: every position still serves as a step-0 key, but only
        these run the query, MLP and later steps. Outputs are [B,S,H] then ([B,T,H] without it).
        """
        b, t = input_ids.shape
        dev = input_ids.device
        layer = self.midlayer
        attn = layer.self_attn
        fused = self.fuse(aux)
        positions = torch.arange(t, device=dev).expand(b, t)
        x0 = layer.inputs(self.embed_tokens(_shift(input_ids, 1)), fused)
        cos, sin = self._rope(positions, x0)
        q_all, keys0, values0 = attn.project(x0, cos, sin)
        if query_pos is None:
            q = q_all
            o = F.scaled_dot_product_attention(q, keys0, values0, is_causal=True)
            qpos, hidden = positions, fused
        else:
            qpos = query_pos
            idx = qpos[:, None, :, None].expand(-1, q_all.shape[1], -1, q_all.shape[-1])
            q = q_all.gather(2, idx)
            mask = torch.arange(t, device=dev)[None, None, :] <= qpos[:, :, None]        # [B,S,T]
            o = F.scaled_dot_product_attention(q, keys0, values0, attn_mask=mask[:, None])
            hidden = fused.gather(1, qpos[..., None].expand(-1, -1, fused.shape[-1]))
        hidden = layer.finish(attn.out(o), hidden)
        outs = [hidden]
        if steps == 1:
            return outs
        scale = 1.0 / math.sqrt(attn.head_dim)
        key_mask = torch.arange(t, device=dev)[None, None, None, :] <= qpos[:, None, :, None]   # [B,1,S,T]
        diag_k: list[torch.Tensor] = []
        diag_v: list[torch.Tensor] = []
        for i in range(1, steps):
            ids = _shift(input_ids, 1 + i).gather(1, qpos)
            x = layer.inputs(self.embed_tokens(ids), hidden)
            cos, sin = self._rope(qpos + i, x)
            q, k, v = attn.project(x, cos, sin)
            diag_k.append(k)
            diag_v.append(v)
            s0 = (q @ keys0.transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~key_mask, float("-inf"))
            sd = torch.stack([(q * kk).sum(-1) for kk in diag_k], dim=-1) * scale      # [B,h,S,i]
            p = torch.softmax(torch.cat([s0, sd], dim=-1).float(), dim=-1).to(q.dtype)
            o = p[..., :t] @ values0 + (p[..., t:, None] * torch.stack(diag_v, dim=-2)).sum(-2)
            hidden = layer.finish(attn.out(o), hidden)
            outs.append(hidden)
        return outs

    # ------------------------------------------------------------ inference

    @torch.no_grad()
    def propose(self, context_ids: torch.Tensor, aux: torch.Tensor, k: int) -> list[int]:
        """Greedy chain of k target-vocabulary ids to follow `context_ids`.

        `aux[t]` holds the target's features at position t. Position t pairs aux[t] with token
        t+1, so the n ids of the context use aux[0 .. n-2] (aux may also carry the last
        position's features, aux[n-1], which are not needed). The first draft comes from the
        last position's step-0 output; each later one feeds back the drafter's own hidden
        state and the embedding of the token just drafted, as in training.
        """
        return self.chain(context_ids, aux, k)[0]

    @torch.no_grad()
    def chain(self, context_ids: torch.Tensor, aux: torch.Tensor, k: int,
              forced: list[int] | None = None,
              cache: StepZeroCache | None = None) -> tuple[list[int], list[torch.Tensor]]:
        """`propose`'s chain and the pre-norm hidden state of each step; `forced` feeds these
        target ids instead of the drafted ones (teacher forcing: what training's steps see).
        `cache`: the step-0 keys and values of the context positions seen by earlier calls on a
        context this one continues (StepZeroCache); only the new positions are computed."""
        ids = torch.as_tensor(context_ids, dtype=torch.long).flatten()
        n = int(ids.shape[0])
        if k <= 0:
            return [], []
        if n < 2 or aux.shape[0] < n - 1:
            raise ValueError(f"propose needs >= 2 context ids and aux for the first n-1 of them; got "
                             f"{n} ids and aux for {aux.shape[0]} positions")
        dev = self.fc.weight.device
        m = n - 1
        layer, attn = self.midlayer, self.midlayer.self_attn
        done = cache.usable(ids.tolist()) if cache is not None else 0
        if cache is not None and done >= m:
            cache = None              # nothing new to append: this call computes it all, uncached
            done = 0
        hidden = self.fuse(aux[done:m].to(dev))[None]                # [1,new,H]
        x = layer.inputs(self.embed_tokens(ids[done + 1:n].to(dev))[None], hidden)
        cos, sin = self._rope(torch.arange(done, m, device=dev)[None], x)
        q, keys, values = attn.project(x, cos, sin)
        if cache is None:
            o = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
            h = layer.finish(attn.out(o), hidden)[:, -1:]            # [1,1,H]
        else:
            if done:
                keys, values = torch.cat([cache.keys, keys], dim=2), torch.cat([cache.values, values], dim=2)
            cache.keep(ids.tolist(), keys, values)
            o = F.scaled_dot_product_attention(q[:, :, -1:], keys, values)   # the last query sees all
            h = layer.finish(attn.out(o), hidden[:, -1:])
        out: list[int] = []
        hiddens = [h[0, 0]]
        for i in range(1, k + 1):
            token = self.to_target(self.logits(h)[0, -1].argmax())
            out.append(int(token))
            if i == k:
                break
            if forced is not None:
                token = torch.tensor(forced[i - 1], device=dev)
            x = layer.inputs(self.embed_tokens(token.view(1, 1)), h)
            cos, sin = self._rope(torch.tensor([[m - 1 + i]], device=dev), x)
            q, kk, vv = attn.project(x, cos, sin)
            keys, values = torch.cat([keys, kk], dim=2), torch.cat([values, vv], dim=2)
            o = F.scaled_dot_product_attention(q, keys, values)      # sees everything so far
            h = layer.finish(attn.out(o), h)
            hiddens.append(h[0, 0])
        return out, hiddens


@dataclass
class StepZeroCache:
    """Step-0 keys and values of the context positions a drafter has seen, for drafting after
    each verify step without recomputing the whole context (evaluate/proposers.py). A position's
    step-0 input, the fused aux of position t with the embedding of token t+1, never changes once
    accepted, so its keys and values hold while the context only grows."""
    ids: list[int] = field(default_factory=list)
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def usable(self, ids: list[int]) -> int:
        """Positions whose keys and values hold for this context (0: start over)."""
        done = 0 if self.keys is None else int(self.keys.shape[2])
        return done if done and ids[:done + 1] == self.ids[:done + 1] else self.reset()

    def reset(self) -> int:
        self.ids, self.keys, self.values = [], None, None
        return 0

    def keep(self, ids: list[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        self.ids, self.keys, self.values = ids, keys, values


def _shift(ids: torch.Tensor, by: int) -> torch.Tensor:
    """ids moved left by `by` along the last axis, padded with id 0."""
    if by >= ids.shape[-1]:
        return torch.zeros_like(ids)
    return torch.cat([ids[..., by:], ids.new_zeros(ids.shape[:-1] + (by,))], dim=-1)
