"""A causal prefill attention kernel that loads K/V with Hopper's TMA: the ceiling study's peer.

Stage 3's kernel (l3_paged/attention_triton.py) gathers each key tile key by key: BLOCK_N
block-table entries, then a [BLOCK_N, D] tensor of pointers, because a 16-token cache block is
smaller than a key tile. This kernel asks what Triton reaches on this GPU when that gather is
not needed: every key tile lies inside one cache block (BLOCK_N divides BLOCK_SIZE), so a tile
is one rectangle of the cache viewed as a 2-D matrix [num_blocks * BLOCK_SIZE, H_kv * D], and
one TMA descriptor load fetches it (no per-element addresses, no registers spent on them).

    BLOCK_SIZE = T (one block holds the whole sequence): a dense layout, the tutorial's case
    BLOCK_SIZE = 64 or 128: a paged cache whose blocks are at least a key tile

It is a benchmark peer (benchmarks/bench_prefill.py), not an engine path: one sequence, q_len =
kv_len = T (a whole-prompt prefill), one program per (query tile, query head), no GQA packing.
WARP_SPEC asks Triton to warp-specialise the key loop (producer warps issue the TMA loads while
consumer warps run the two matmuls and the softmax); where the compiler cannot, the study
reports the config as failed.
"""
from __future__ import annotations

import torch

from plumbing.runtime import INTERPRET  # noqa: F401  (before triton: picks GPU or interpreter)

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E = 1.4426950408889634


@triton.jit
def _key_tiles(acc, l_i, m_i, q, k_desc, v_desc, bt_ptr, rows, lo, hi, kv_col, qk_scale,
               BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
               WARP_SPEC: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
        blk = tl.load(bt_ptr + start_n // BLOCK_SIZE)                 # one table entry per tile
        row0 = blk * BLOCK_SIZE + start_n % BLOCK_SIZE
        k = k_desc.load([row0, kv_col])                               # [N, D] one TMA copy
        s = tl.dot(q, k.T)                                            # [M, N] fp32
        if MASKED:
            n = start_n + tl.arange(0, BLOCK_N)
            s = tl.where(n[None, :] <= rows[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([row0, kv_col])                               # [N, D]
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _prefill_tma_kernel(q_desc, k_desc, v_desc, o_desc, bt_ptr, qk_scale,
                        G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WARP_SPEC: tl.constexpr):
    q_tile = tl.num_programs(0) - 1 - tl.program_id(0)               # longest query tiles first
    head = tl.program_id(1)
    m0 = q_tile * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    q = q_desc.load([m0, head * HEAD_DIM])                            # [M, D]
    kv_col = (head // G) * HEAD_DIM
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Keys [0, m0) are visible to every row; [m0, m0 + BLOCK_M) is the diagonal, masked.
    acc, l_i, m_i = _key_tiles(acc, l_i, m_i, q, k_desc, v_desc, bt_ptr, rows, 0, m0, kv_col, qk_scale,
                               BLOCK_SIZE, BLOCK_N, False, WARP_SPEC)
    acc, l_i, m_i = _key_tiles(acc, l_i, m_i, q, k_desc, v_desc, bt_ptr, rows, m0, m0 + BLOCK_M, kv_col,
                               qk_scale, BLOCK_SIZE, BLOCK_N, True, WARP_SPEC)
    o_desc.store([m0, head * HEAD_DIM], (acc / l_i[:, None]).to(o_desc.dtype))


def prefill_tma(q, k_cache, v_cache, block_table, *, block_m=128, block_n=64, num_warps=8, num_stages=3,
                warp_spec=False, out=None):
    """Causal attention of one T-token prompt over its own keys. q [T, H_q, D]; k/v_cache
    [num_blocks, BLOCK_SIZE, H_kv, D] holding the prompt's keys at block_table[0, j // BLOCK_SIZE]."""
    T, H_q, D = q.shape
    _, block_size, H_kv, _ = k_cache.shape
    if T % block_m or block_m % block_n or block_size % block_n:
        raise ValueError(f"needs T % block_m == 0, block_m % block_n == 0 and block_size % block_n == 0 "
                         f"(T={T}, block_m={block_m}, block_n={block_n}, block_size={block_size})")
    out = torch.empty_like(q) if out is None else out
    q2, o2 = q.view(T, H_q * D), out.view(T, H_q * D)
    k2, v2 = k_cache.view(-1, H_kv * D), v_cache.view(-1, H_kv * D)
    q_desc = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [block_m, D])
    o_desc = TensorDescriptor(o2, list(o2.shape), list(o2.stride()), [block_m, D])
    k_desc = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [block_n, D])
    v_desc = TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [block_n, D])
    _prefill_tma_kernel[(T // block_m, H_q)](
        q_desc, k_desc, v_desc, o_desc, block_table, D ** -0.5 * LOG2E,
        G=H_q // H_kv, HEAD_DIM=D, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n,
        WARP_SPEC=warp_spec, num_warps=num_warps, num_stages=num_stages)
    return out
