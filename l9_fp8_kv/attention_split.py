"""Split-KV decode over an e4m3 cache: stage 8's windowed splits, with stage 9's loads.

Stage 8 (l8_sliding_window/attention_split.py) cuts the keys a decode query sees, from the
window's first key tile ``base`` to kv_len, into ``num_splits`` chunks; stage 7's merge combines
the partials, told each sequence's span. Here the chunks are walked by ``_fp8_tiles``
(attention.py): codes and per-key scales, the scales applied to scores and probabilities.
A full-attention layer has ``window = NO_WINDOW``, so base = 0: stage 7's split exactly.

    keys:   0 .... base ..|.. kv_len - W .................. kv_len
                     split 0 (first tile masked) | split 1 | ... | split n-1 (last tile masked at kv_len)
"""
from __future__ import annotations

import dataclasses

import torch

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError

import triton
import triton.language as tl

from l3_paged.attention_triton import LOG2E
from l3_paged.kernel_config import KernelConfig
from l7_fast.attention_split import MAX_SPLITS, WAVES, _merge, _split_chunk, split_config

from .attention import NO_WINDOW, _fp8_tiles, _tensor_scales, check_fp8_cache, dot_dtype, paged_attention_fp8
from .write import kernel_view


def fp8_split_config(num_seqs: int, g_pad: int, d_pad: int, dtype) -> KernelConfig:
    """Stage 7's split tile (``split_config``), with 128-key steps where it takes 64: a tile of e4m3
    keys is half the bytes of a bf16 one. H100 sweep (bench_fp8's shapes, per token-head): 8 x 8192,
    7 splits, 88.8 us at 128 keys against 112.6 us at 64; 4 warps, 2 stages stay best."""
    cfg = split_config(num_seqs, g_pad, d_pad, dtype)
    return cfg if INTERPRET or cfg.block_n != 64 else dataclasses.replace(cfg, block_n=128)


FP8_MIN_KEYS = 256          # stage 9's split floor, as measured (stage 7 went to 64 later, for its 32-key steps)


def fp8_num_splits(num_seqs: int, num_kv_heads: int, max_kv_len: int, num_sms: int) -> int:
    """Key splits of a decode step over an e4m3 cache: enough for WAVES programs per SM rounded
    down, never past them, and at least FP8_MIN_KEYS keys a split (its 128-key tile). For this
    kernel a last, partial wave cost more than it shared (H100, 8 x 8,192, 8 KV heads, 132 SMs: 6
    splits 66.5 us, 7 splits 73.1 us, 8 splits 77.6 us; docs/benchmarks.md, stage 9). Why it differs
    from the bf16 kernel there is not profiled. (Stage 7's rule rounds up to a power of two.)"""
    base = num_seqs * num_kv_heads
    if base >= num_sms:
        return 1
    return max(1, min((WAVES * num_sms) // base, max_kv_len // FP8_MIN_KEYS, MAX_SPLITS))


@triton.jit(do_not_specialize=["num_splits", "window"])
def _fp8_split_kernel(q_ptr, kc, vc, ks, vs, acc_ptr, m_ptr, l_ptr, kv_lens_ptr, span_ptr, bt_ptr, qk_scale,
                      num_splits, window, stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_sb,
                      stride_ss, stride_sh, stride_bt, BLOCK_SIZE: tl.constexpr, G: tl.constexpr,
                      ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                      DOT: tl.constexpr, BY_HAND: tl.constexpr, PER_TENSOR: tl.constexpr):
    kv_head, split, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_len = tl.load(kv_lens_ptr + seq)
    base = tl.maximum(kv_len - window, 0) // BLOCK_N * BLOCK_N
    if (kv_head == 0) & (split == 0):
        tl.store(span_ptr + seq, kv_len - base)                     # the merge counts splits by it
    chunk = _split_chunk(kv_len - base, num_splits, BLOCK_N)
    lo = base + split * chunk
    if lo >= kv_len:
        return
    hi = tl.minimum(lo + chunk, kv_len)
    edge_hi = tl.where((split == 0) & (kv_len > window), tl.minimum(lo + BLOCK_N, hi), lo)   # the lower edge
    full_hi = edge_hi + (hi - edge_hi) // BLOCK_N * BLOCK_N
    rows = tl.arange(0, ROWS)
    head = kv_head * G + rows
    row_ok = rows < G
    offs_d = tl.arange(0, D_PAD)
    io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    kc, vc = kc + kv_head * stride_ch, vc + kv_head * stride_ch
    ks, vs = ks + kv_head * stride_sh, vs + kv_head * stride_sh
    q, qk_scale, v_scale = _tensor_scales(q_ptr + seq.to(tl.int64) * stride_qt + head[:, None] * stride_qh
                                          + offs_d[None, :], io_mask, ks, vs, qk_scale, DOT, PER_TENSOR)
    limit = tl.zeros([ROWS], tl.int32) + kv_len - 1
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    acc, l_i, m_i = tl.zeros([ROWS, D_PAD], tl.float32), tl.zeros([ROWS], tl.float32), \
        tl.full([ROWS], float("-inf"), tl.float32)
    for run in tl.static_range(3):                                  # lower edge, whole tiles, the tail at kv_len
        a = lo if run == 0 else edge_hi if run == 1 else full_hi
        b = edge_hi if run == 0 else full_hi if run == 1 else hi
        acc, l_i, m_i = _fp8_tiles(acc, l_i, m_i, q, kc, vc, ks, vs, bt_row, a, b, kv_len, limit, window, offs_d,
                                   stride_cb, stride_cs, stride_sb, stride_ss, qk_scale, BLOCK_SIZE, HEAD_DIM,
                                   BLOCK_N, run != 1, BY_HAND, PER_TENSOR)
    part = (seq.to(tl.int64) * (tl.num_programs(0) * G) + head) * num_splits + split
    tl.store(m_ptr + part, m_i, mask=row_ok)
    tl.store(l_ptr + part, l_i, mask=row_ok)
    tl.store(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc * v_scale, mask=io_mask)


def paged_attention_fp8_split(q, k_cache, v_cache, k_scale, v_scale, cu_seqlens_q, seq_lens_kv, block_table, *,
                              max_seqlen_q: int, num_splits: int, window: int | None = None, scale=None,
                              config: KernelConfig | None = None, check: bool = True):
    """``paged_attention_fp8`` whose decode steps split the keys a query sees over ``num_splits``
    programs; steps with a prefill chunk, and ``num_splits == 1``, run ``paged_attention_fp8``."""
    T, H_q, D = q.shape
    S = seq_lens_kv.shape[0]
    if max_seqlen_q != 1 or T != S or num_splits == 1 or not 1 <= D <= 256:
        return paged_attention_fp8(q, k_cache, v_cache, k_scale, v_scale, cu_seqlens_q, seq_lens_kv, block_table,
                                   max_seqlen_q=max_seqlen_q, window=window, scale=scale, config=config,
                                   check=check)
    if check:
        check_fp8_cache(q, k_cache, v_cache, k_scale, v_scale)
    if not isinstance(num_splits, int) or not 1 <= num_splits <= 65535:
        raise UserError(f"num_splits must be a host int in 1..65535, got {num_splits!r}")
    _, block_size, H_kv, _ = k_cache.shape
    G, d_pad = H_q // H_kv, max(16, triton.next_power_of_2(D))
    cfg = config or fp8_split_config(S, triton.next_power_of_2(G), d_pad, k_cache.dtype)
    scale = D ** -0.5 if scale is None else float(scale)
    f32 = dict(device=q.device, dtype=torch.float32)
    out, span = torch.empty_like(q), torch.empty_like(seq_lens_kv)
    acc = torch.empty(S, H_q, num_splits, D, **f32)
    m, l = torch.empty(S, H_q, num_splits, **f32), torch.empty(S, H_q, num_splits, **f32)
    _fp8_split_kernel[(H_kv, num_splits, S)](
        q, kernel_view(k_cache), kernel_view(v_cache), k_scale, v_scale, acc, m, l, seq_lens_kv, span, block_table,
        scale * LOG2E, num_splits, NO_WINDOW if window is None else window, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_scale.stride(0), k_scale.stride(1),
        k_scale.stride(2), block_table.stride(0), BLOCK_SIZE=block_size, G=G, ROWS=max(16, triton.next_power_of_2(G)),
        HEAD_DIM=D, D_PAD=d_pad, BLOCK_N=cfg.block_n, DOT=dot_dtype(q), BY_HAND=INTERPRET,
        PER_TENSOR=k_scale.stride() == (0, 0, 0), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    _merge(acc, m, l, out, span, num_splits, cfg.block_n)
    return out
