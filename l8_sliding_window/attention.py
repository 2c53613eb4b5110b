"""Sliding-window paged attention: the reference (the spec) and the Triton kernel.

Stage 3's rule, with a lower edge. Query token i of sequence s sits at absolute position
p = kv_len - q_len + i and, in a layer with window W, sees keys

    p - W < j <= p          (transformers' ``sliding_window_overlay``: kv_idx > q_idx - W)

so at most W keys, itself included. Stage 3's rule is the case W = infinity.

The kernel has stage 3's grid and tile (l3_paged/attention_triton.py): one program per (kv head,
query tile, sequence), BLOCK_Q tokens x G heads as rows. A tile's rows see, together, the keys
from its first row's lower edge to its last row's causal edge; it walks only those, in three runs:

    keys:   0 ............ lo ......... full_lo ........ full_hi ........ hi ........ kv_len
            never read     | lower edge | every row sees  | causal edge   |
            (freed blocks  | masked     | every key:      | masked        |
             may be here)  |            | stage 3's loop  |               |

``lo`` is rounded down and ``hi`` up to whole key tiles. A row may see nothing in a tile of the
lower edge, so the running max starts from a safe value (no ``-inf - -inf``). Tiles wholly below
``lo`` are never loaded: the KV manager may already have given their blocks to another request.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError

import triton
import triton.language as tl

from l3_paged.attention_ref import visible_keys
from l3_paged.attention_triton import LOG2E, _attend_tiles
from l3_paged.kernel_config import KernelConfig, pick_config


def window_keys(q_len: int, kv_len: int, window: int | None, device) -> torch.Tensor:
    """``[q_len, kv_len]`` bool: stage 3's causal rule, and key j no more than window - 1 behind."""
    seen = visible_keys(q_len, kv_len, device)
    if window is None:
        return seen
    q_pos = torch.arange(q_len, device=device) + (kv_len - q_len)
    return seen & (torch.arange(kv_len, device=device)[None, :] > q_pos[:, None] - window)


def window_attention_ref(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table, *, window, scale=None):
    """The spec: gather each sequence's keys, mask with ``window_keys``, attend in float32."""
    T, H_q, D = q.shape
    _, block_size, H_kv, _ = k_cache.shape
    out = torch.empty_like(q)
    cu, lens = cu_seqlens_q.tolist(), seq_lens_kv.tolist()
    for s, kv_len in enumerate(lens):
        q_len = cu[s + 1] - cu[s]
        if q_len == 0:
            continue
        ids = block_table[s, :-(-kv_len // block_size)].long()
        k, v = (c[ids].reshape(-1, H_kv, D)[:kv_len].float().transpose(0, 1) for c in (k_cache, v_cache))
        qs = q[cu[s]:cu[s + 1]].float().transpose(0, 1)                          # [H_q, q_len, D]
        k, v = k.repeat_interleave(H_q // H_kv, 0), v.repeat_interleave(H_q // H_kv, 0)  # [H_q, kv_len, D]
        mask = window_keys(q_len, kv_len, window, q.device)
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)   # [H_q, q_len, D]
        out[cu[s]:cu[s + 1]] = o.transpose(0, 1).to(q.dtype)
    return out


def poison_below_window(args, q_lens, window: int) -> None:
    """For tests and benchmarks: NaN in every block of a ``make_paged_batch`` batch that lies wholly
    below the lowest key any query of its sequence sees. A kernel that loads one returns NaN."""
    _, k, v, _, kv_lens, table = args
    bs = k.shape[1]
    for s, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens.tolist())):
        for i in range(max(0, kv_len - q_len - window + 1) // bs):
            k[table[s, i]] = float("nan")
            v[table[s, i]] = float("nan")


@triton.jit
def _window_edge(acc, l_i, m_i, q, k_base, v_base, bt_row, lo, hi, kv_len, limit, window, offs_d,
                 stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE: tl.constexpr, qk_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """Keys [lo, hi), each row masked to limit - window < j <= limit (and j < kv_len)."""
    lowest = tl.min(limit, 0) - window + 1                                      # the first row's lower edge
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)                                       # [N]
        # Load only keys some row sees: a masked score does not protect p @ v from a NaN (0 * NaN),
        # and the blocks below the window may be freed and hold another request's K/V by now.
        in_seq = (j < kv_len) & (j >= lowest)
        phys = tl.load(bt_row + j // BLOCK_SIZE, mask=in_seq, other=0).to(tl.int64)
        row_off = phys * stride_kb + (j % BLOCK_SIZE) * stride_ks               # [N]
        ok = in_seq[:, None] & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_base + row_off[:, None] + offs_d[None, :], mask=ok, other=0.0)
        v = tl.load(v_base + (phys * stride_vb + (j % BLOCK_SIZE) * stride_vs)[:, None] + offs_d[None, :],
                    mask=ok, other=0.0)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        seen = (j[None, :] <= limit[:, None]) & (j[None, :] > limit[:, None] - window) & in_seq[None, :]
        s = tl.where(seen, tl.dot(q, tl.trans(k), input_precision="ieee"), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)                   # a row that saw nothing yet
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s * qk_scale - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["window"])
def _window_attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_q_ptr, kv_lens_ptr, bt_ptr, qk_scale, window,
                        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                        stride_ot, stride_oh, stride_bt, BLOCK_SIZE: tl.constexpr, G: tl.constexpr,
                        G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
                        BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
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
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=io_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    limit = kv_len - q_len + tok                                        # [M] each row's own position
    first = kv_len - q_len + q_tile * BLOCK_Q                           # the tile's first and last rows
    last = kv_len - q_len + tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len) - 1
    lo = tl.maximum(first - window + 1, 0) // BLOCK_N * BLOCK_N         # below: no row sees it
    hi = last + 1                                                       # the causal edge's end
    full_lo = tl.cdiv(tl.maximum(last - window + 1, 0), BLOCK_N) * BLOCK_N   # every row sees [full_lo, full_hi)
    full_hi = (first + 1) // BLOCK_N * BLOCK_N
    narrow = full_lo >= full_hi                                         # window narrower than the tile:
    full_lo = tl.where(narrow, lo, full_lo)                             # every key goes through the mask
    full_hi = tl.where(narrow, lo, full_hi)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    k_base, v_base = k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    acc, l_i, m_i = _window_edge(acc, l_i, m_i, q, k_base, v_base, bt_row, lo, full_lo, kv_len, limit, window,
                                 offs_d, stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, qk_scale,
                                 HEAD_DIM, BLOCK_N, UPCAST)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_row, full_lo, full_hi, kv_len, limit,
                                  offs_d, stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, qk_scale,
                                  HEAD_DIM, D_PAD, BLOCK_N, False, UPCAST)
    acc, l_i, m_i = _window_edge(acc, l_i, m_i, q, k_base, v_base, bt_row, full_hi, hi, kv_len, limit, window,
                                 offs_d, stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE, qk_scale,
                                 HEAD_DIM, BLOCK_N, UPCAST)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]    # l > 0 for every real row (it sees itself); padding rows may see none
    tl.store(o_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=io_mask)


def paged_attention_window(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table, *, max_seqlen_q: int,
                           window: int, scale=None, config: KernelConfig | None = None):
    """Stage 3's ``paged_attention_triton`` with a sliding window of ``window`` keys (a host int >= 1)."""
    T, H_q, D = q.shape
    _, block_size, H_kv, _ = k_cache.shape
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise UserError(f"window must be a host int >= 1, got {window!r} (no window: stage 3's kernel)")
    if not 1 <= D <= 256:
        raise UserError(f"head_dim D={D} unsupported: the kernel handles 1..256")
    out = torch.empty_like(q)                                          # [T, H_q, D]
    S = seq_lens_kv.shape[0]
    if T == 0 or S == 0 or max_seqlen_q == 0:
        return out
    g_pad, d_pad = triton.next_power_of_2(H_q // H_kv), max(16, triton.next_power_of_2(D))
    cfg = config or pick_config(max_seqlen_q, T, S, g_pad, d_pad, q.dtype)
    scale = D ** -0.5 if scale is None else float(scale)
    grid = (H_kv, triton.cdiv(max_seqlen_q, cfg.block_q), S)
    _window_attn_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, seq_lens_kv, block_table, scale * LOG2E, window,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        block_table.stride(0), BLOCK_SIZE=block_size, G=H_q // H_kv, G_PAD=g_pad, HEAD_DIM=D, D_PAD=d_pad,
        BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, UPCAST=INTERPRET and q.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
