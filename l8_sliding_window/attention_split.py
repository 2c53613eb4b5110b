"""Split-KV decode with a sliding window: stage 7's flash-decoding over the window's keys only.

A decode query at position p = kv_len - 1 sees keys kv_len - W <= j < kv_len. Stage 7 cuts
[0, kv_len) into NUM_SPLITS chunks; here the same cut is made over the window, starting from
its first key rounded down to a key tile:

    keys:   0 ............. base ..|.. kv_len - W ......................... kv_len
            never read       split 0 (first tile masked: _window_edge) | split 1 | ... | split n-1
                              span = kv_len - base keys, chunk = stage 7's _split_chunk(span, ...)

So a 32,768-token sequence with a 4,096 window costs what a 4,096-token one does: the same
splits, over the same number of keys. Split 0's first tile goes through stage 8's masked edge
(only keys some row sees are loaded: blocks below the window may be freed); the rest is stage 7's
loop, unmasked, then masked at kv_len. Stage 7's merge kernel combines the partials unchanged: it
is told each sequence's ``span`` instead of kv_len, which program (0, 0, s) writes for it.
"""
from __future__ import annotations

import torch

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError

import triton
import triton.language as tl

from l3_paged.attention_triton import LOG2E, _attend_tiles
from l3_paged.kernel_config import KernelConfig
from l7_fast.attention_split import _merge, _split_chunk, split_config

from .attention import _window_edge, paged_attention_window


@triton.jit(do_not_specialize=["num_splits", "window"])
def _window_split_kernel(q_ptr, k_ptr, v_ptr, acc_ptr, m_ptr, l_ptr, kv_lens_ptr, span_ptr, bt_ptr, qk_scale,
                         num_splits, window, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh,
                         stride_vb, stride_vs, stride_vh, stride_bt, BLOCK_SIZE: tl.constexpr, G: tl.constexpr,
                         ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                         UPCAST: tl.constexpr):
    kv_head, split, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_len = tl.load(kv_lens_ptr + seq)
    base = tl.maximum(kv_len - window, 0) // BLOCK_N * BLOCK_N   # the window's first tile
    span = kv_len - base
    if (kv_head == 0) & (split == 0):
        tl.store(span_ptr + seq, span)                          # what the merge counts splits by
    chunk = _split_chunk(span, num_splits, BLOCK_N)
    lo = base + split * chunk
    if lo >= kv_len:
        return
    hi = tl.minimum(lo + chunk, kv_len)
    edge_hi = tl.where(split == 0, tl.minimum(lo + BLOCK_N, hi), lo)   # split 0's first tile: masked
    full_hi = edge_hi + (hi - edge_hi) // BLOCK_N * BLOCK_N
    rows = tl.arange(0, ROWS)
    head = kv_head * G + rows
    row_ok = rows < G
    offs_d = tl.arange(0, D_PAD)
    io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=io_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    limit = tl.zeros([ROWS], tl.int32) + kv_len - 1
    k_head, v_head = k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    acc, l_i, m_i = tl.zeros([ROWS, D_PAD], tl.float32), tl.zeros([ROWS], tl.float32), \
        tl.full([ROWS], float("-inf"), tl.float32)
    acc, l_i, m_i = _window_edge(acc, l_i, m_i, q, k_head, v_head, bt_row, lo, edge_hi, kv_len, limit, window,
                                 offs_d, stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, qk_scale,
                                 HEAD_DIM, BLOCK_N, UPCAST)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_head, v_head, bt_row, edge_hi, full_hi, kv_len, limit,
                                  offs_d, stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, qk_scale,
                                  HEAD_DIM, D_PAD, BLOCK_N, False, UPCAST)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_head, v_head, bt_row, full_hi, hi, kv_len, limit,
                                  offs_d, stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, qk_scale,
                                  HEAD_DIM, D_PAD, BLOCK_N, True, UPCAST)
    part = (seq.to(tl.int64) * (tl.num_programs(0) * G) + head) * num_splits + split
    tl.store(m_ptr + part, m_i, mask=row_ok)
    tl.store(l_ptr + part, l_i, mask=row_ok)
    tl.store(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=io_mask)


def paged_attention_window_split(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table, *, max_seqlen_q: int,
                                 window: int, num_splits: int, scale=None, config: KernelConfig | None = None):
    """``paged_attention_window`` whose decode steps split the window's keys over ``num_splits``
    programs per (kv head, sequence). Steps with a prefill chunk, and ``num_splits == 1``, run
    ``paged_attention_window`` (one program walks at most W keys)."""
    T, H_q, D = q.shape
    _, block_size, H_kv, _ = k_cache.shape
    S = seq_lens_kv.shape[0]
    if max_seqlen_q != 1 or T != S or num_splits == 1 or not 1 <= D <= 256:
        return paged_attention_window(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table,
                                      max_seqlen_q=max_seqlen_q, window=window, scale=scale, config=config)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise UserError(f"window must be a host int >= 1, got {window!r} (no window: stage 7's split kernel)")
    if not isinstance(num_splits, int) or not 1 <= num_splits <= 65535:
        raise UserError(f"num_splits must be a host int in 1..65535, got {num_splits!r}")
    G = H_q // H_kv
    d_pad = max(16, triton.next_power_of_2(D))
    keys = triton.cdiv(min(window, block_table.shape[1] * block_size), num_splits)   # a split's keys, at most
    cfg = config or split_config(S, triton.next_power_of_2(G), d_pad, q.dtype, keys)
    scale = D ** -0.5 if scale is None else float(scale)
    f32 = dict(device=q.device, dtype=torch.float32)
    out = torch.empty_like(q)
    acc = torch.empty(S, H_q, num_splits, D, **f32)
    m, l = torch.empty(S, H_q, num_splits, **f32), torch.empty(S, H_q, num_splits, **f32)
    span = torch.empty_like(seq_lens_kv)
    _window_split_kernel[(H_kv, num_splits, S)](
        q, k_cache, v_cache, acc, m, l, seq_lens_kv, span, block_table, scale * LOG2E, num_splits, window,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_table.stride(0),
        BLOCK_SIZE=block_size, G=G, ROWS=max(16, triton.next_power_of_2(G)), HEAD_DIM=D, D_PAD=d_pad,
        BLOCK_N=cfg.block_n, UPCAST=INTERPRET and q.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    _merge(acc, m, l, out, span, num_splits, cfg.block_n)
    return out
