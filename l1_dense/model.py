"""The model skeleton: Qwen3 / Qwen2 / Llama decoder, written once for all five stages.

Everything here is token-flat: a forward pass sees ``T`` tokens (one sequence's prompt, one
decode token, or in later stages the tokens of many sequences concatenated) and no batch dim.

    input_ids [T] -> embed -> [T, hidden]
      for each layer:
        h = h + o_proj( attention( rope( norm_qk( q_proj, k_proj ) ), v_proj ) )   # attention
        h = h + down_proj( silu(gate_proj(h)) * up_proj(h) )                       # SwiGLU MLP
      norm -> lm_head on the rows named by meta.logits_indices -> logits [S, vocab]

Attention itself is *not* in this file. Each attention layer hands q, k, v to the stage's KV
object: ``kv.attend(layer_idx, q, k, v, meta) -> [T, H_q, D]``. The KV object stores k and v
wherever its stage keeps them (a dense tensor, a token-flat pool, a block tensor) and runs its
own attention (SDPA, a host gather, a Triton kernel). That is the seam a stage that stores K/V
another way needs; none edits this file.

The small ops of the hot path (add + RMSNorm, the q/k/v projections, q/k-norm + RoPE + the
attention call, the gated activation) go through ``model.ops``, a :class:`TorchOps` written with
plain torch: it is the spec. A stage may pass other ops with the same methods and the same
rounding (``forward(..., ops=...)``): that is the second seam; the arithmetic above is unchanged.

A checkpoint whose config gives layers a sliding window (``cfg.layer_windows``) runs only with a
KV object that says it implements them (``kv.sliding_windows = True``); ``forward`` refuses any
other rather than attend to keys the model never sees.

``meta`` is the stage's per-step metadata. The skeleton reads two fields from it:
``positions`` ([T] int64, RoPE positions) and ``logits_indices`` ([S] int64, the rows whose
next-token logits we need: the last token of each sequence). Module names mirror Hugging Face's
(``model.layers.0.self_attn.q_proj`` ...) so checkpoints load without renaming.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from plumbing.errors import WindowsUnsupported
from plumbing.exercise import learner_can_replace


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 then cast back (as transformers does)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [D/2], float32, with Llama 3 scaling when the config asks for it."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
    # Llama 3: keep high frequencies, divide low ones by `factor`, interpolate in between.
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_ctx / lo, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_ctx / hi) * ~(wavelen > old_ctx / lo)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@learner_can_replace  # lesson 1's build-it exercise: exercises/l1_dense.py
def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D], cos/sin [T, D] -> [T, H, D] (the 'rotate half' convention of HF checkpoints)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class TorchOps:
    """The hot path's small ops in plain torch: the readable spec.

    Another object with these five methods may be passed instead (``model(ids, kv, meta, ops=...)``),
    as long as it rounds at the same points. Every method takes the module whose weights it uses.
    """

    def add_rms_norm(self, delta, h, norm):
        """``h = h + delta`` (skipped when delta is None), then ``(h, norm(h))``."""
        if delta is not None:
            h = h + delta
        return h, norm(h)

    def qkv(self, attn, x):
        """The three projections: ``[T, H_q*D], [T, H_kv*D], [T, H_kv*D]``."""
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    def rope_attend(self, attn, q, k, v, cos, sin, kv, meta):
        """q/k-norm (Qwen3), RoPE, then the stage's KV object stores k, v and attends."""
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head's D channels, before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return kv.attend(attn.layer_idx, q, k, v, meta)               # [T, H_q, D]

    def gate_up_act(self, mlp, x):
        """SwiGLU's gate: ``silu(gate_proj(x)) * up_proj(x)``, [T, intermediate]."""
        return F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)

    def linear(self, lin, x):
        """The projections back to the residual stream (o_proj, down_proj): ``lin(x)``."""
        return lin(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.h_q, self.h_kv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.h_q * self.d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.h_kv * self.d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.h_kv * self.d, bias=bias)
        # Qwen2 has biases on q/k/v only; Llama and Qwen3 use one flag for all four.
        self.o_proj = nn.Linear(self.h_q * self.d, cfg.hidden_size, bias=bias and cfg.family != "qwen2")
        if cfg.qk_norm:  # Qwen3 (TorchOps.rope_attend applies them)
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv, meta, ops):
        T = x.shape[0]
        q, k, v = ops.qkv(self, x)                      # [T, H_q*D], [T, H_kv*D], [T, H_kv*D]
        q = q.view(T, self.h_q, self.d)                 # [T, H_q, D]
        k = k.view(T, self.h_kv, self.d)                # [T, H_kv, D]
        v = v.view(T, self.h_kv, self.d)                # [T, H_kv, D]
        o = ops.rope_attend(self, q, k, v, cos, sin, kv, meta)   # [T, H_q, D], token-major
        return ops.linear(self.o_proj, o.reshape(T, self.h_q * self.d))  # token-major: no transpose


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x, ops):  # [T, hidden] -> [T, inter] -> [T, hidden]
        return ops.linear(self.down_proj, ops.gate_up_act(self, x))   # silu(gate_proj(x)) * up_proj(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, delta, cos, sin, kv, meta, ops):
        """h = h + self_attn(norm(h)); h = h + mlp(norm(h)), with each add done by the next norm:
        ``delta`` is the previous sublayer's output, not yet added to the residual stream ``h``
        (None at layer 0). Returns ``(h, delta)`` the same way. The sums and their rounding are
        the usual ones; the order lets an add and the norm after it be one op (a fused kernel can)."""
        h, x = ops.add_rms_norm(delta, h, self.input_layernorm)       # h += delta; x = norm(h)
        h, x = ops.add_rms_norm(self.self_attn(x, cos, sin, kv, meta, ops), h, self.post_attention_layernorm)
        return h, self.mlp(x, ops)                                    # the MLP's output is the next delta


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """``model(input_ids [T], kv, meta) -> logits [S, vocab]`` (float32), S = len(meta.logits_indices)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)  # [D/2] fp32
        self.ops = TorchOps()                                         # the default; forward(ops=...) overrides it

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """positions [T] -> cos, sin [T, D], computed in float32 and then cast (as HF does)."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)                       # [T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, kv, meta, ops=None) -> torch.Tensor:
        if self.cfg.windowed and not getattr(kv, "sliding_windows", False):
            raise WindowsUnsupported(f"this {self.cfg.architecture} checkpoint gives layers a sliding window "
                            f"({sorted({w for w in self.cfg.layer_windows if w})} keys), and this stage's KV cache "
                            "attends to every key, which would give other tokens than the model's: run it with "
                            "stage 8 (l8_sliding_window) or later.")
        ops = self.ops if ops is None else ops
        h, delta = self.model.embed_tokens(input_ids), None           # [T, hidden]
        cos, sin = self.rope(meta.positions, h.dtype)
        for layer in self.model.layers:
            h, delta = layer(h, delta, cos, sin, kv, meta, ops)
        rows = meta.logits_indices                                    # the rows that sample
        _, h = ops.add_rms_norm(delta[rows], h[rows], self.model.norm)   # [S, hidden]
        return self.lm_head(h).float()                                # [S, vocab]
