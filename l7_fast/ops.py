"""The skeleton's ops seam (``l1_dense/model.py``: ``TorchOps``) filled with fused Triton kernels.

Per decoder layer, the torch path launches about 40 small kernels besides the matmuls and the
attention kernel (RMSNorm alone is ~7: cast, pow, mean, add, rsqrt, mul, cast, mul). Here:

    torch path (TorchOps, the spec)             fused path (FusedOps)
    h = h + delta; x = norm(h)                  add_rms_norm         1 kernel   (fused_norm.py)
    q_proj(x), k_proj(x), v_proj(x)             x @ W_qkv^T          1 matmul   (weights merged)
    q_norm, k_norm, apply_rope x2, set_kv       qk_norm_rope_write   1 kernel   (fused_rope.py)
    attention (stage 3's kernel)                attend_cached        1-2 kernels (split-KV)
                                                (both: the cache's rope_attend, cache.py)
    silu(gate_proj(x)) * up_proj(x)             x @ W_gate_up^T, silu_mul  1 matmul + 1 kernel
    o_proj(o), down_proj(a)                     the same matmuls               1 matmul each

A step of at most GEMV_MAX_M tokens (a small decode batch) takes every one of those matmuls
through gemv.py instead of cuBLAS, SwiGLU in the gate/up matmul's epilogue (silu_mul=True) and
each add + RMSNorm in the prologue of the matmul that reads its output:
    add+norm+qkv | rope+write | attention | o_proj | add+norm+gate_up+SiLU | down     per layer
There ``add_rms_norm`` computes nothing: it returns a ``PendingNorm``, the recipe of its output
(h, delta, the norm), and the next matmul applies it while it loads its input. The last norm,
before the lm_head, runs as its own kernel: the lm_head stays on cuBLAS, which streams it at the
copy bandwidth (a recipe there would have no kernel to go into).

Every kernel rounds where the torch op does (normalise in float32, cast, then scale), so in
float32 the two paths agree to float noise and in bfloat16 to a rare last-bit difference.

Merged weights: ``merge_projections(model)`` concatenates q/k/v (and gate/up) rows into one
matrix per layer and re-points the original ``q_proj.weight`` etc. at row slices of it, so no
byte is duplicated and the torch path keeps working on the same model. One wider matmul reads
the same weights as three narrow ones but launches once. In bfloat16 cuBLAS may pick another
algorithm for the wider matmul, so its output can differ from the three narrow ones in the last
bit: that is the one source of bf16 difference that is not a kernel's (lessons/l7_fast/2_fused_ops.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import fused_act
from .fused_norm import add_rms_norm, rms_norm
from .gemv import GEMV_MAX_M, gemv, gemv_block_m
from .pdl import pdl_supported


def _merge(linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One [sum(out), in] weight (and bias) whose row slices become the linears' own weights."""
    w = torch.cat([lin.weight.data for lin in linears])
    biases = [lin.bias for lin in linears]
    b = torch.cat([x.data for x in biases]) if all(x is not None for x in biases) else None
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = w[start:start + n]            # a view: same values, no second copy
        if b is not None:
            lin.bias.data = b[start:start + n]
        start += n
    return w, b


def merge_projections(model) -> None:
    """Give every layer ``attn.qkv_weight`` / ``qkv_bias`` and ``mlp.gate_up_weight``. Idempotent."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not hasattr(attn, "qkv_weight"):
            attn.qkv_weight, attn.qkv_bias = _merge([attn.q_proj, attn.k_proj, attn.v_proj])
            attn.qkv_sizes = [attn.h_q * attn.d, attn.h_kv * attn.d, attn.h_kv * attn.d]
        if not hasattr(mlp, "gate_up_weight"):
            mlp.gate_up_weight, _ = _merge([mlp.gate_proj, mlp.up_proj])


@dataclass
class PendingNorm:
    """``norm(h + delta)``, not computed yet: the GEMV that reads it computes it in its prologue
    and writes ``h + delta`` to ``h_out`` (the residual stream the layer goes on with)."""
    h: torch.Tensor
    delta: torch.Tensor | None
    norm: torch.nn.Module
    h_out: torch.Tensor

    @property
    def shape(self):                                 # what the layer reads of its input (T)
        return self.h.shape

    def gemv_args(self) -> dict:
        fresh = self.delta is not None
        return dict(norm_weight=self.norm.weight, eps=self.norm.eps, delta=self.delta,
                    residual_out=self.h_out if fresh else None)


class FusedOps:
    """``model.forward(ids, kv, meta, ops=FusedOps(model))``: the same five ops as the skeleton's
    ``TorchOps`` (l1_dense/model.py), fused. ``kv`` must have ``rope_attend`` (cache.py)."""

    def __init__(self, model, gemv_max_m: int = GEMV_MAX_M, norm_prologue: bool = True, pdl: bool = True):
        merge_projections(model)
        # the GEMVs, the rope write and (runner.py) the split attention with programmatic dependent
        # launch where the GPU has it (pdl.py; lessons/l7_fast/9_pdl.md)
        self.pdl = pdl and pdl_supported(next(model.parameters()).device)
        self.gemv_max_m = gemv_max_m                 # 0: cuBLAS for every step (bench_l7's earlier rows)
        self.norm_prologue = norm_prologue           # False: the norm as its own kernel (bench_l7's row)
        self.final_norm = model.model.norm           # its output feeds the lm_head (cuBLAS): never pending

    def gemv_tile(self, M: int) -> int | None:
        """The GEMV's BLOCK_M for a step of M tokens, or None: cuBLAS (warmup.py plans by it)."""
        return gemv_block_m(M) if M <= self.gemv_max_m else None

    def add_rms_norm(self, delta, h, norm):
        if self.norm_prologue and norm is not self.final_norm and self.gemv_tile(h.shape[0]):
            h_out = h if delta is None else torch.empty_like(h)   # every GEMV program reads h: a new buffer
            return h_out, PendingNorm(h, delta, norm, h_out)      # the next matmul's prologue computes it
        if delta is None:
            return h, rms_norm(h, norm.weight, norm.eps)
        x, h = add_rms_norm(delta, h, norm.weight, norm.eps, residual_out=h)   # h updated in place
        return h, x

    def matmul(self, x, weight, bias=None, silu_mul: bool = False):
        """``x @ weight.T + bias``: the Triton GEMV for a few rows, cuBLAS for more. x may be a
        PendingNorm (only ever for a few rows): the GEMV computes it on the way in."""
        if isinstance(x, PendingNorm):
            return gemv(x.h, weight, bias, silu_mul=silu_mul, pdl=self.pdl, **x.gemv_args())
        if self.gemv_tile(x.shape[0]):
            return gemv(x, weight, bias, silu_mul=silu_mul, pdl=self.pdl)
        y = F.linear(x, weight, bias)
        return fused_act.silu_mul(y) if silu_mul else y

    def qkv(self, attn, x):
        return self.matmul(x, attn.qkv_weight, attn.qkv_bias).split(attn.qkv_sizes, dim=-1)   # 3 views

    def rope_attend(self, attn, q, k, v, cos, sin, kv, meta):
        """q/k-norm, RoPE and the K/V write in one kernel, then attention: the cache's, which knows
        where K/V go and which kernel reads them (cache.py)."""
        return kv.rope_attend(attn, q, k, v, cos, sin, meta, pdl=self.pdl)

    def gate_up_act(self, mlp, x):
        return self.matmul(x, mlp.gate_up_weight, silu_mul=True)       # a GEMV: SwiGLU in its epilogue

    def linear(self, lin, x):
        return self.matmul(x, lin.weight, lin.bias)
