"""Paged attention over an e4m3 cache: the reference (the spec) and the Triton kernel.

Stage 8's kernel (l8_sliding_window/attention.py) with its loads changed. A key tile is read as
e4m3 codes plus one float32 scale per key, and the scales never touch the D channels:

    q . (code_j * ks_j)  =  (q . code_j) * ks_j            s = tl.dot(q, codes^T) * ks[None, :]
    sum_j p_j (code_j * vs_j)  =  sum_j (p_j * vs_j) code_j    acc += tl.dot(p * vs[None, :], codes)

so dequantizing costs two [M, N] multiplies per tile, and the bytes streamed per key are D + 4
instead of 2D. With one scale per tensor (a 0-stride tensor) even those go: k_scale joins the
softmax scale and v_scale multiplies the output once (PER_TENSOR). The dots run in float16
(``dot_dtype``): every e4m3 value is a float16 value, and e4m3 -> float16 is one GPU instruction.

Windows are stage 8's rule, and a layer without one gets a window longer than any sequence
(``NO_WINDOW``), so one kernel serves both kinds of layer. Key runs, as in stage 8:

    [lo, full_lo)  lower edge, masked  |  [full_lo, full_hi)  every row sees every key  |  [full_hi, hi)  causal edge, masked

The reference dequantizes the cache (``dequantize_kv``) and runs stage 8's reference on it, so
Triton = reference up to the order of float32 sums: the kernel's rounding points that the
reference lacks are the query and p * vs cast to the dot's dtype (float16; float32 for float32).
"""
from __future__ import annotations

import torch

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError

import triton
import triton.language as tl

from l3_paged.attention_triton import LOG2E
from l3_paged.kernel_config import KernelConfig, pick_config
from l8_sliding_window.attention import window_attention_ref

from .e4m3 import dequantize_kv, e4m3_decode
from .write import kernel_view

NO_WINDOW = 1 << 30           # a full-attention layer's "window": longer than any sequence


def fp8_attention_ref(q, k_cache, v_cache, k_scale, v_scale, cu_seqlens_q, seq_lens_kv, block_table, *,
                      window: int | None, scale=None):
    """The spec: the cache dequantized (codes * scales, float32), then stage 8's reference."""
    k, v = dequantize_kv(k_cache, k_scale), dequantize_kv(v_cache, v_scale)
    return window_attention_ref(q, k, v, cu_seqlens_q, seq_lens_kv, block_table, window=window, scale=scale)


@triton.jit
def _load_codes(ptrs, mask, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    if BY_HAND:
        return e4m3_decode(tl.load(ptrs, mask=mask, other=0)).to(dtype)
    return tl.load(ptrs, mask=mask, other=0.0).to(dtype)


@triton.jit
def _fp8_tiles(acc, l_i, m_i, q, kc, vc, ks, vs, bt_row, lo, hi, kv_len, limit, window, offs_d,
               stride_cb, stride_cs, stride_sb, stride_ss, qk_scale, BLOCK_SIZE: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, BY_HAND: tl.constexpr,
               PER_TENSOR: tl.constexpr):
    """Online softmax over keys [lo, hi) of an e4m3 cache. MASKED: each row sees
    limit - window < j <= limit (and j < kv_len); only keys some row sees are loaded. q arrives in
    the dot's dtype. PER_TENSOR: the caller folded k_scale into qk_scale and applies v_scale to
    the output, so no per-key scale is loaded."""
    lowest = tl.min(limit, 0) - window + 1
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        if MASKED:
            live = (j < kv_len) & (j >= lowest)
        else:
            live = j >= 0
        phys = tl.load(bt_row + j // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
        off = j % BLOCK_SIZE
        at = (phys * stride_cb + off * stride_cs)[:, None] + offs_d[None, :]
        ok = live[:, None] & (offs_d[None, :] < HEAD_DIM)
        k = _load_codes(kc + at, ok, q.dtype, BY_HAND)
        v = _load_codes(vc + at, ok, q.dtype, BY_HAND)
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
        if not PER_TENSOR:
            s_at = phys * stride_sb + off * stride_ss
            s = s * tl.load(ks + s_at, mask=live, other=0.0)[None, :]
        if MASKED:
            seen = (j[None, :] <= limit[:, None]) & (j[None, :] > limit[:, None] - window) & live[None, :]
            s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)             # a row that saw nothing yet
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s * qk_scale - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if not PER_TENSOR:
            p = p * tl.load(vs + s_at, mask=live, other=0.0)[None, :]
        acc = tl.dot(p.to(q.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _tensor_scales(q_ptrs, mask, ks, vs, qk_scale, DOT: tl.constexpr, PER_TENSOR: tl.constexpr):
    """The query in the dot's dtype; per tensor, qk_scale * k_scale and v_scale (1.0 otherwise)."""
    q = tl.load(q_ptrs, mask=mask, other=0.0).to(DOT)
    if PER_TENSOR:
        return q, qk_scale * tl.load(ks), tl.load(vs)
    return q, qk_scale, 1.0


@triton.jit(do_not_specialize=["window"])
def _fp8_attn_kernel(q_ptr, kc, vc, ks, vs, o_ptr, cu_q_ptr, kv_lens_ptr, bt_ptr, qk_scale, window,
                     stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_sb, stride_ss, stride_sh,
                     stride_ot, stride_oh, stride_bt, BLOCK_SIZE: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
                     HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                     DOT: tl.constexpr, BY_HAND: tl.constexpr, PER_TENSOR: tl.constexpr):
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    kv_head, seq = tl.program_id(0), tl.program_id(2)
    q_tile = tl.num_programs(1) - 1 - tl.program_id(1)                  # longest query tiles first
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + seq)
    if q_tile * BLOCK_Q >= q_len:
        return
    rows = tl.arange(0, BLOCK_M)
    tok = q_tile * BLOCK_Q + rows // G_PAD
    head = kv_head * G + rows % G_PAD
    offs_d = tl.arange(0, D_PAD)
    io_mask = ((tok < q_len) & (rows % G_PAD < G))[:, None] & (offs_d[None, :] < HEAD_DIM)
    q_rows = (q_start + tok).to(tl.int64)
    kc, vc = kc + kv_head * stride_ch, vc + kv_head * stride_ch
    ks, vs = ks + kv_head * stride_sh, vs + kv_head * stride_sh
    q, qk_scale, v_scale = _tensor_scales(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh
                                          + offs_d[None, :], io_mask, ks, vs, qk_scale, DOT, PER_TENSOR)
    limit = kv_len - q_len + tok
    first = kv_len - q_len + q_tile * BLOCK_Q
    last = kv_len - q_len + tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len) - 1
    lo = tl.maximum(first - window + 1, 0) // BLOCK_N * BLOCK_N
    full_lo = tl.cdiv(tl.maximum(last - window + 1, 0), BLOCK_N) * BLOCK_N
    full_hi = (first + 1) // BLOCK_N * BLOCK_N
    narrow = full_lo >= full_hi
    full_lo = tl.where(narrow, lo, full_lo)
    full_hi = tl.where(narrow, lo, full_hi)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    for run in tl.static_range(3):                                     # lower edge, every key seen, causal edge
        a = lo if run == 0 else full_lo if run == 1 else full_hi
        b = full_lo if run == 0 else full_hi if run == 1 else last + 1
        acc, l_i, m_i = _fp8_tiles(acc, l_i, m_i, q, kc, vc, ks, vs, bt_row, a, b, kv_len, limit, window, offs_d,
                                   stride_cb, stride_cs, stride_sb, stride_ss, qk_scale, BLOCK_SIZE, HEAD_DIM,
                                   BLOCK_N, run != 1, BY_HAND, PER_TENSOR)
    out = acc * v_scale / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=io_mask)


def dot_dtype(q):
    """The kernels' dot dtype: float32 for float32 queries, else float16. e4m3 -> float16 is one
    instruction on the GPU (cvt.rn.f16x2.e4m3x2) and exact; e4m3 -> bfloat16 is not an instruction
    on Hopper, and converting there held the kernel to 61% of copy bandwidth (lesson 9.6). A
    bfloat16 query is exact in float16 while every |q| lies in [2**-14, 65504]; the interpreter's
    bfloat16 dot is wrong, so the CPU takes the same float16 path."""
    return tl.float32 if q.dtype == torch.float32 else tl.float16


def check_fp8_cache(q, k_cache, v_cache, k_scale, v_scale) -> None:
    if k_cache.dtype != torch.float8_e4m3fn or v_cache.dtype != k_cache.dtype or v_cache.shape != k_cache.shape:
        raise UserError(f"k/v_cache must be float8_e4m3fn [num_blocks, block_size, H_kv, D], got {k_cache.dtype} "
                        f"{tuple(k_cache.shape)} and {v_cache.dtype} {tuple(v_cache.shape)}")
    if k_scale.shape != k_cache.shape[:3] or v_scale.shape != k_scale.shape or v_scale.stride() != k_scale.stride() \
            or k_scale.dtype != torch.float32 or v_scale.dtype != torch.float32:
        raise UserError(f"k/v_scale must be float32 {tuple(k_cache.shape[:3])} with equal strides (per tensor: "
                        f"one value expanded), got {tuple(k_scale.shape)} {k_scale.stride()} and "
                        f"{tuple(v_scale.shape)} {v_scale.stride()}")
    if k_cache.stride() != v_cache.stride():
        raise UserError(f"k_cache and v_cache must share strides, got {k_cache.stride()} and {v_cache.stride()}")
    if not 1 <= q.shape[2] <= 256:
        raise UserError(f"head_dim D={q.shape[2]} unsupported: the kernel handles 1..256")


def paged_attention_fp8(q, k_cache, v_cache, k_scale, v_scale, cu_seqlens_q, seq_lens_kv, block_table, *,
                        max_seqlen_q: int, window: int | None = None, scale=None,
                        config: KernelConfig | None = None, check: bool = True):
    """Stage 8's ``paged_attention_window`` on an e4m3 cache; ``window=None``: full attention.
    ``check=False``: the engine, whose cache checks the layout once per step (``--check``)."""
    if check:
        check_fp8_cache(q, k_cache, v_cache, k_scale, v_scale)
    T, H_q, D = q.shape
    _, block_size, H_kv, _ = k_cache.shape
    out = torch.empty_like(q)
    S = seq_lens_kv.shape[0]
    if T == 0 or S == 0 or max_seqlen_q == 0:
        return out
    g_pad, d_pad = triton.next_power_of_2(H_q // H_kv), max(16, triton.next_power_of_2(D))
    cfg = config or pick_config(max_seqlen_q, T, S, g_pad, d_pad, k_cache.dtype)
    scale = D ** -0.5 if scale is None else float(scale)
    kc, vc = kernel_view(k_cache), kernel_view(v_cache)
    _fp8_attn_kernel[(H_kv, triton.cdiv(max_seqlen_q, cfg.block_q), S)](
        q, kc, vc, k_scale, v_scale, out, cu_seqlens_q, seq_lens_kv, block_table, scale * LOG2E,
        NO_WINDOW if window is None else window, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), k_scale.stride(0), k_scale.stride(1), k_scale.stride(2), out.stride(0), out.stride(1),
        block_table.stride(0), BLOCK_SIZE=block_size, G=H_q // H_kv, G_PAD=g_pad, HEAD_DIM=D, D_PAD=d_pad,
        BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, DOT=dot_dtype(q), BY_HAND=INTERPRET,
        PER_TENSOR=k_scale.stride() == (0, 0, 0), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def quantize_batch(args, per_token: bool, tensor_scales=(1.0, 1.0)):
    """For tests and benchmarks: a ``make_paged_batch`` batch with its cache in e4m3 (per tensor:
    K and V divided by ``tensor_scales``). Returns (q, k_codes, v_codes, k_scale, v_scale,
    cu_seqlens_q, seq_lens_kv, block_table); the unused slots' NaN stays NaN (code 0x7F), so a
    kernel that reads one returns NaN."""
    from .e4m3 import quantize_kv
    q, k, v, cu, kv_lens, table = args
    out = []
    for c, t in zip((k, v), tensor_scales):
        n, bs, h, d = c.shape
        one = None if per_token else torch.full((n * bs, h), float(t), device=c.device)
        codes, scale = quantize_kv(c.view(-1, h, d), one)
        out += [codes.view(n, bs, h, d), scale.view(n, bs, h) if per_token else
                torch.full((1,), float(t), device=c.device).expand(n, bs, h)]
    return q, out[0], out[2], out[1], out[3], cu, kv_lens, table
