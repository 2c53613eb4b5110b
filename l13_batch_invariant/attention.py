"""Paged attention whose sum over keys has one order per query position, whatever the batch.

Stage 3's kernel picks its tiles from the step (decode, mixed, prefill: ``pick_config``), and
stage 7 splits a decode step's keys into a split COUNT chosen from the batch (``pick_num_splits``),
cutting each sequence's keys at ``kv_len / count``. Either way a token at position p is summed in
another order in another batch. Here the cut points are key positions only:

    q [T, H_q, D]   k/v_cache [num_blocks, block_size, H_kv, D]   cu_seqlens_q [S+1]   seq_lens_kv [S]
    block_table [S, max_blocks]   ->   out [T, H_q, D]

    keys [0, p] of a query at position p are cut at multiples of SPLIT_KEYS; each split is walked
    BLOCK_N keys at a time by stage 3's online-softmax loop (``_attend_tiles``, imported) from a
    fresh state (m, l, acc), and the splits are folded in key order:

        (M, L, A) <- (-inf, 0, 0)
        for each split s = 0, 1, ...:   M' = max(M, m_s)
                                        L  = fma(L, 2^(M - M'), l_s * 2^(m_s - M'))
                                        A  = fma(A, 2^(M - M'), acc_s * 2^(m_s - M'));  M = M'
        out = A / L

    with one tile shape (ROWS query rows x BLOCK_N keys, 4 warps) for every step.

Two launches compute that same fold, and the host picks by the step (any choice, the same bits):

    fold   grid (H_kv, q tiles, S): a program walks its tile's splits and folds them in registers.
           Prefill, chunks, verification, mixed steps, and decode steps that fill the GPU.
    split  grid (H_kv, splits, S), decode-only steps: a program per split writes (m, l, acc) in
           float32, ``_fold_merge_kernel`` folds them in split order. More programs for a few long
           sequences (stage 7's reason to split), without a count from the batch.

A split that holds none of a row's keys (the row's position is before it) is made (-inf, 0, 0),
whose fold changes nothing, so a prefill tile may walk splits its early rows never see.
"""
from __future__ import annotations

import torch

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError
from plumbing.exercise import learner_can_replace

import triton
import triton.language as tl

from l3_paged.attention_triton import LOG2E, _attend_tiles
from l3_paged.validate import check_paged_layout

SPLIT_KEYS = 256      # keys per split: the cut points, for every query and every batch
BLOCK_N = 64          # keys per step of the loop (SPLIT_KEYS is a multiple)
ROWS = 64             # query rows of a tile: ROWS // G_PAD tokens x G_PAD heads, for every step


@triton.jit
def _fold(M, L, A, m, l, a):
    """One more split (m, l, a) into the running (M, L, A): rows [R], accumulators [R, D]."""
    M_new = tl.maximum(M, m)
    alpha = tl.exp2(M - M_new)
    beta = tl.exp2(m - M_new)
    L = tl.fma(L, alpha, l * beta)
    A = tl.fma(A, alpha[:, None], a * beta[:, None])
    return M_new, L, A


@triton.jit
def _fixed_split_kernel(q_ptr, k_ptr, v_ptr, o_ptr, acc_ptr, m_ptr, l_ptr, cu_q_ptr, kv_lens_ptr, bt_ptr,
                        qk_scale, max_splits, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh,
                        stride_vb, stride_vs, stride_vh, stride_ot, stride_oh, stride_bt,
                        BLOCK_SIZE: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                        D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                        SPLIT_KEYS: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr):
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    kv_head, seq = tl.program_id(0), tl.program_id(2)
    q_tile = 0 if SPLIT else tl.num_programs(1) - 1 - tl.program_id(1)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + seq)
    if q_tile * BLOCK_Q >= q_len:
        return
    rows = tl.arange(0, BLOCK_M)                         # stage 3's tile: (token, head in group) rows
    tok = q_tile * BLOCK_Q + rows // G_PAD               # [M]
    head = kv_head * G + rows % G_PAD                    # [M]
    row_ok = (tok < q_len) & (rows % G_PAD < G)
    offs_d = tl.arange(0, D_PAD)
    io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + (q_start + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
                + offs_d[None, :], mask=io_mask, other=0.0)                        # [M, D_PAD]
    if UPCAST:
        q = q.to(tl.float32)
    limit = kv_len - q_len + tok                                                   # [M] last key seen
    full_hi = (kv_len - q_len + q_tile * BLOCK_Q + 1) // BLOCK_N * BLOCK_N          # every row sees [0, full_hi)
    masked_hi = kv_len - q_len + tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len)      # some row sees [.., masked_hi)
    c_lo = tl.program_id(1) if SPLIT else 0
    c_hi = c_lo + 1 if SPLIT else tl.cdiv(masked_hi, SPLIT_KEYS)
    if c_lo * SPLIT_KEYS >= masked_hi:                   # a split past this sequence's keys
        return
    k_base, v_base = k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    M_i, L_i, A_i = tl.full([BLOCK_M], float("-inf"), tl.float32), tl.zeros([BLOCK_M], tl.float32), \
        tl.zeros([BLOCK_M, D_PAD], tl.float32)                  # the fold's running state
    for c in range(c_lo, c_hi):
        lo = c * SPLIT_KEYS
        hi = tl.minimum(lo + SPLIT_KEYS, masked_hi)
        mid = tl.maximum(lo, tl.minimum(hi, full_hi))    # [lo, mid) unmasked, [mid, hi) masked
        acc, l_i, m_i = tl.zeros_like(A_i), tl.zeros_like(L_i), tl.full([BLOCK_M], float("-inf"), tl.float32)
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_row, lo, mid, kv_len, limit, offs_d,
                                      stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, qk_scale,
                                      HEAD_DIM, D_PAD, BLOCK_N, False, UPCAST)
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_row, mid, hi, kv_len, limit, offs_d,
                                      stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, qk_scale,
                                      HEAD_DIM, D_PAD, BLOCK_N, True, UPCAST)
        seen = lo <= limit                               # [M] the row sees this split's first key
        m_i = tl.where(seen, m_i, float("-inf"))         # unseen: (-inf, 0, 0), a fold that changes nothing
        l_i = tl.where(seen, l_i, 0.0)
        acc = tl.where(seen[:, None], acc, 0.0)
        M_i, L_i, A_i = _fold(M_i, L_i, A_i, m_i, l_i, acc)
    if SPLIT:                                            # this split's state: [T, H_q, max_splits(, D)]
        part = ((q_start + tok).to(tl.int64) * (tl.num_programs(0) * G) + head) * max_splits + c_lo
        tl.store(m_ptr + part, M_i, mask=row_ok)
        tl.store(l_ptr + part, L_i, mask=row_ok)
        tl.store(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], A_i, mask=io_mask)
    else:
        out = A_i / L_i[:, None]
        tl.store(o_ptr + (q_start + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh
                 + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _fold_merge_kernel(acc_ptr, m_ptr, l_ptr, o_ptr, kv_lens_ptr, max_splits, stride_ot, stride_oh,
                       H_Q: tl.constexpr, H_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                       SPLIT_KEYS: tl.constexpr):
    """Decode-only steps: token t (= sequence t) folds its splits 0, 1, ... in order, every head at once."""
    t = tl.program_id(0)
    kv_len = tl.load(kv_lens_ptr + t)
    heads = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, D_PAD)
    h_ok = heads < H_Q
    io_mask = h_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    M_i = tl.full([H_PAD], float("-inf"), tl.float32)
    L_i = tl.zeros([H_PAD], tl.float32)
    A_i = tl.zeros([H_PAD, D_PAD], tl.float32)
    for c in range(0, tl.cdiv(kv_len, SPLIT_KEYS)):
        part = (t.to(tl.int64) * H_Q + heads) * max_splits + c                    # [H_PAD]
        m = tl.load(m_ptr + part, mask=h_ok, other=0.0)
        l = tl.load(l_ptr + part, mask=h_ok, other=1.0)
        a = tl.load(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=io_mask, other=0.0)
        M_i, L_i, A_i = _fold(M_i, L_i, A_i, m, l, a)
    out = A_i / L_i[:, None]
    tl.store(o_ptr + t.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=io_mask)


def paged_attention_invariant(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table, *, max_seqlen_q: int,
                              num_splits: int = 1, scale=None, split_keys: int = SPLIT_KEYS, block_n: int = BLOCK_N,
                              rows: int = ROWS, check: bool = True):
    """Batch-invariant paged attention. Returns ``[T, H_q, D]``. ``num_splits`` (a host int): split
    programs per sequence for a decode-only step, enough for ``cdiv(longest kv_len, split_keys)``
    (``splits_for``); 1 (or any step with a longer query) runs the fold launch. The bits are the
    same either way. ``split_keys`` / ``block_n`` / ``rows`` are the invariant's constants, open so
    a test can plant a batch-dependent one and see its check fail."""
    if check:
        check_paged_layout(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table)
    T, H_q, D = q.shape
    _, block_size, H_kv, _ = k_cache.shape
    S = seq_lens_kv.shape[0]
    if not 1 <= D <= 256:
        raise UserError(f"head_dim D={D} unsupported: the kernel handles 1..256")
    if not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        raise UserError(f"max_seqlen_q must be a host int >= 0, got {max_seqlen_q!r}")
    if not isinstance(num_splits, int) or not 1 <= num_splits <= 65535:
        raise UserError(f"num_splits must be a host int in 1..65535, got {num_splits!r}")
    if split_keys % block_n or block_n < 16 or block_n & (block_n - 1):
        raise UserError(f"split_keys ({split_keys}) must be a multiple of block_n ({block_n}), a power of two >= 16")
    out = torch.empty_like(q)                                            # [T, H_q, D]
    if T == 0 or S == 0 or max_seqlen_q == 0:
        return out
    G = H_q // H_kv
    g_pad, d_pad = triton.next_power_of_2(G), max(16, triton.next_power_of_2(D))
    block_q = max(1, rows // g_pad)
    split = max_seqlen_q == 1 and T == S and num_splits > 1
    scale = D ** -0.5 if scale is None else float(scale)
    f32 = dict(device=q.device, dtype=torch.float32)
    n = num_splits if split else 1
    acc = torch.empty(T, H_q, n, D, **f32) if split else out             # [T, H_q, splits, D]: split only
    m, l = (torch.empty(T, H_q, n, **f32), torch.empty(T, H_q, n, **f32)) if split else (out, out)
    grid = (H_kv, num_splits if split else triton.cdiv(max_seqlen_q, block_q), S)
    if grid[1] > 65535 or S > 65535:
        raise UserError(f"grid {grid} exceeds CUDA's 65535 limit on axes 1/2: split the batch")
    _fixed_split_kernel[grid](q, k_cache, v_cache, out, acc, m, l, cu_seqlens_q, seq_lens_kv, block_table,
                              scale * LOG2E, n, q.stride(0), q.stride(1),
                              k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                              v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                              out.stride(0), out.stride(1), block_table.stride(0),
                              BLOCK_SIZE=block_size, G=G, G_PAD=g_pad, HEAD_DIM=D, D_PAD=d_pad, BLOCK_Q=block_q,
                              BLOCK_N=block_n, SPLIT_KEYS=split_keys, SPLIT=split,
                              UPCAST=INTERPRET and q.dtype == torch.bfloat16, num_warps=4, num_stages=2)
    if split:
        _fold_merge_kernel[(T,)](acc, m, l, out, seq_lens_kv, n, out.stride(0), out.stride(1), H_Q=H_q,
                                 H_PAD=triton.next_power_of_2(H_q), HEAD_DIM=D, D_PAD=d_pad,
                                 SPLIT_KEYS=split_keys, num_warps=4)
    return out


@learner_can_replace  # lesson 13's build-it exercise: exercises/l13_batch_invariant.py
def splits_for(num_seqs: int, num_kv_heads: int, max_kv_len: int, num_sms: int, split_keys: int = SPLIT_KEYS) -> int:
    """Split programs per sequence for a decode step (host ints): every split of the longest
    sequence when the fold grid (a program per sequence and kv head) leaves SMs idle, else 1. Any
    answer that is 1 or covers every split gives the same bits: the cut points are fixed."""
    if num_seqs * num_kv_heads >= num_sms:
        return 1
    return max(1, min(triton.cdiv(max_kv_len, split_keys), 65535))
