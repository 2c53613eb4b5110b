"""Stage 7's fused q/k-norm + RoPE + KV write, quantizing K and V to e4m3 as it writes them.

Stage 7's kernel (l7_fast/fused_rope.py) with one head per program, for BLOCK_T tokens (a row
each: 1 on a GPU, up to 64 under the interpreter, stage 7's rule): q heads are normed and roped
into q_out, k heads roped and stored in the cache beside their v head. Here the k/v program rounds
what it stores:

    scale  per token-head: amax(|k_head|) / 448, written beside the block (ks[block, offset, head])
           per tensor:     read from the layer's one value (the scale tensor has every stride 0)
    code   e4m3(clamp(k_head / scale, -448, 448))      round to nearest even (e4m3.py)

Same for v with its own scale. The division is correctly rounded (``div_rn``: Triton's plain
``/`` is an approximate reciprocal on a GPU), so the codes equal ``quantize_kv``'s (the torch
path, e4m3.py) bit for bit, on the GPU and under the interpreter, which uses the hand encoder.

    k/v_cache    [num_blocks, block_size, H_kv, D]  float8_e4m3fn (uint8 under the interpreter)
    k/v_scale    [num_blocks, block_size, H_kv]     float32 (per tensor: a 0-stride view of one value)
"""
from __future__ import annotations

import torch

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError

import triton
import triton.language as tl

from l7_fast.fused_rope import _norm_rope, _tokens_per_program

from .e4m3 import FP8, FP8_MAX, e4m3_encode


@triton.jit
def _head_scale(x1, x2, ptr, ok, PER_TOKEN: tl.constexpr):
    """Each row's (token's) scale for one head, [ROWS, 1]: computed from its values and stored, or
    the layer's one value, read. ``ptr`` [ROWS, 1]; ``ok`` [ROWS, 1]: the rows written."""
    if PER_TOKEN:
        amax = tl.maximum(tl.max(tl.abs(x1.to(tl.float32)), 1), tl.max(tl.abs(x2.to(tl.float32)), 1))[:, None]
        scale = tl.math.div_rn(amax, 448.0)
        scale = tl.where(scale == 0.0, 1.0, scale)                      # an all-zero head: any scale works
        tl.store(ptr, scale, mask=ok)
        return scale
    return tl.load(ptr, mask=ok, other=1.0)


@triton.jit
def _store_e4m3(dst, x, d, ok, scale, BY_HAND: tl.constexpr):
    y = tl.minimum(tl.maximum(tl.math.div_rn(x.to(tl.float32), scale), -448.0), 448.0)   # saturate, never NaN
    if BY_HAND:
        tl.store(dst + d, e4m3_encode(y), mask=ok)                      # the interpreter's cast is wrong
    else:
        tl.store(dst + d, y.to(tl.float8e4nv), mask=ok)                 # the hardware's: nearest even


@triton.jit(do_not_specialize=["T"])   # the token count: a runtime int, no variant per T
def _rope_write_fp8_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, qo_ptr, kc_ptr, vc_ptr,
                           ks_ptr, vs_ptr, slot_ptr, inv_d, eps, T, H_q, stride_qt, stride_qh, stride_kt, stride_kh,
                           stride_vt, stride_vh, stride_ct, stride_st, stride_ot, stride_oh,
                           stride_cb, stride_cs, stride_ch, stride_sb, stride_ss, stride_sh,
                           BLOCK_SIZE: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                           HAS_NORM: tl.constexpr, PER_TOKEN: tl.constexpr, BY_HAND: tl.constexpr,
                           BLOCK_T: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]   # [BLOCK_T, 1] tokens
    h = tl.program_id(1)                                                # one head
    d = tl.arange(0, HALF_PAD)[None, :]                                 # [1, HALF_PAD]
    ok = (t < T) & (d < HALF)
    c1 = tl.load(cos_ptr + t * stride_ct + d, mask=ok, other=0.0)
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + d, mask=ok, other=0.0)
    s1 = tl.load(sin_ptr + t * stride_st + d, mask=ok, other=0.0)
    s2 = tl.load(sin_ptr + t * stride_st + HALF + d, mask=ok, other=0.0)
    if h < H_q:                                                         # a q head: as stage 7
        o1, o2 = _norm_rope(q_ptr + t * stride_qt + h * stride_qh, qw_ptr, c1, c2, s1, s2, d, ok,
                            inv_d, eps, HALF, HAS_NORM)
        dst = qo_ptr + t * stride_ot + h * stride_oh
        tl.store(dst + d, o1, mask=ok)
        tl.store(dst + HALF + d, o2, mask=ok)
    else:                                                               # a kv head: quantized into the cache
        kh = h - H_q
        slot = tl.load(slot_ptr + t, mask=t < T, other=-1)              # [BLOCK_T, 1]
        ok = ok & (slot >= 0)                                           # slot < 0: a padding row, no write
        k1, k2 = _norm_rope(k_ptr + t * stride_kt + kh * stride_kh, kw_ptr, c1, c2, s1, s2, d, ok,
                            inv_d, eps, HALF, HAS_NORM)
        v_src = v_ptr + t * stride_vt + kh * stride_vh
        v1, v2 = tl.load(v_src + d, mask=ok, other=0.0), tl.load(v_src + HALF + d, mask=ok, other=0.0)
        blk, off = slot // BLOCK_SIZE, slot % BLOCK_SIZE
        sc = blk * stride_sb + off * stride_ss + kh * stride_sh
        row_ok = (t < T) & (slot >= 0)
        k_scale = _head_scale(k1, k2, ks_ptr + sc, row_ok, PER_TOKEN)
        v_scale = _head_scale(v1, v2, vs_ptr + sc, row_ok, PER_TOKEN)
        cache = blk * stride_cb + off * stride_cs + kh * stride_ch
        _store_e4m3(kc_ptr + cache, k1, d, ok, k_scale, BY_HAND)
        _store_e4m3(kc_ptr + cache + HALF, k2, d, ok, k_scale, BY_HAND)
        _store_e4m3(vc_ptr + cache, v1, d, ok, v_scale, BY_HAND)
        _store_e4m3(vc_ptr + cache + HALF, v2, d, ok, v_scale, BY_HAND)


def kernel_view(cache: torch.Tensor) -> torch.Tensor:
    """The cache as a kernel receives it: uint8 bits under the interpreter (hand-decoded), else e4m3."""
    return cache.view(torch.uint8) if INTERPRET else cache


def rope_write_fp8(q, k, v, cos, sin, k_cache, v_cache, k_scale, v_scale, slot_mapping, *, per_token: bool,
                   q_norm_weight=None, k_norm_weight=None, eps=1e-6, q_out=None):
    """Stage 7's ``qk_norm_rope_write`` into an e4m3 cache. Returns the roped q ``[T, H_q, D]``."""
    T, H_q, D = q.shape
    _, block_size, H_kv, _ = k_cache.shape
    if k_cache.dtype != FP8 or v_cache.shape != k_cache.shape or v_cache.dtype != FP8:
        raise UserError(f"k/v_cache must be [num_blocks, block_size, H_kv, D] {FP8}, got {k_cache.dtype} "
                        f"{tuple(k_cache.shape)} and {v_cache.dtype} {tuple(v_cache.shape)}")
    if k.shape != (T, H_kv, D) or v.shape != k.shape or cos.shape != (T, D) or sin.shape != (T, D) or D % 2:
        raise UserError(f"q [T, H_q, D] = {tuple(q.shape)} wants k, v [{T}, {H_kv}, {D}] and cos, sin [{T}, {D}] "
                        f"with D even; got {tuple(k.shape)}, {tuple(v.shape)}, {tuple(cos.shape)}, {tuple(sin.shape)}")
    if k_scale.shape != k_cache.shape[:3] or v_scale.stride() != k_scale.stride() or k_scale.dtype != torch.float32:
        raise UserError(f"k/v_scale must be float32 [num_blocks, block_size, H_kv] = {tuple(k_cache.shape[:3])} "
                        f"with equal strides, got {k_scale.dtype} {tuple(k_scale.shape)}, strides {k_scale.stride()} "
                        f"and {v_scale.stride()}")
    if per_token and 0 in k_scale.stride():
        raise UserError("per_token=True writes a scale per token and head: k/v_scale need their own storage")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise UserError("pass both q/k norm weights or neither")
    q_out = torch.empty(T, H_q, D, dtype=q.dtype, device=q.device) if q_out is None else q_out
    if T == 0:
        return q_out
    norm = q_norm_weight is not None
    qw, kw = (q_norm_weight, k_norm_weight) if norm else (q, q)
    kc, vc = kernel_view(k_cache), kernel_view(v_cache)
    bt = _tokens_per_program(T)                                       # tokens per program: stage 7's rule
    _rope_write_fp8_kernel[(triton.cdiv(T, bt), H_q + H_kv)](
        q, k, v, cos, sin, qw, kw, q_out, kc, vc, k_scale, v_scale, slot_mapping, 1.0 / D, float(eps), T, H_q,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        q_out.stride(0), q_out.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_scale.stride(0), k_scale.stride(1), k_scale.stride(2),
        BLOCK_SIZE=block_size, HALF=D // 2, HALF_PAD=triton.next_power_of_2(D // 2), HAS_NORM=norm,
        PER_TOKEN=per_token, BY_HAND=INTERPRET, BLOCK_T=bt, num_warps=1 if D <= 128 else 2, enable_fp_fusion=False)
    return q_out


assert FP8_MAX == 448.0       # the kernels spell the bound out: e4m3fn's largest finite value
