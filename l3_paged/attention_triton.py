"""Path B: paged attention as ONE Triton kernel launch for the whole batch.

Same inputs and math as the reference (attention_ref.py is the spec):

    q            [T, H_q, D]                        all sequences' new tokens, token-flat
    k/v_cache    [num_blocks, block_size, H_kv, D]  paged K/V (new tokens already written)
    cu_seqlens_q [S+1] int32,  seq_lens_kv [S] int32,  block_table [S, max_blocks] int32
    out          [T, H_q, D]

    query token i of sequence s, head h (kv head h // G, G = H_q / H_kv):
        out[i, h] = sum_j softmax_j(scale * q_i . k_j) v_j   over j = 0 .. kv_len - q_len + i

Grid: (H_kv, cdiv(max_seqlen_q, BLOCK_Q), S). Built from host ints, so launching never waits
for the GPU. One program owns a tile of BLOCK_Q query tokens of one sequence and ALL G query
heads that share one kv head. Those BLOCK_Q * G_PAD (token, head) pairs are the M rows of the
tile, so every K/V tile it loads serves the whole group (GQA without repeating K/V):

    row r  ->  token  q_tile * BLOCK_Q + r // G_PAD,   head  kv_head * G + r % G_PAD

The program walks its sequence's keys BLOCK_N at a time. Key j sits in physical block
block_table[s, j // block_size] at offset j % block_size, so BLOCK_N and the cache's
block_size are independent. For each key tile it keeps the flash-attention running state per
row (max m, normaliser l, un-normalised output acc, all float32) and rescales on the fly:

    s     = (q @ k^T) * scale * log2(e)                [M, BLOCK_N]  (log2 domain: exp2 is cheap)
    m_new = max(m, rowmax(s));   alpha = 2^(m - m_new);   p = 2^(s - m_new)   [M, BLOCK_N]
    l     = l * alpha + rowsum(p);     acc = acc * alpha + p @ v;     m = m_new
    out   = acc / l                                    at the end

Key tiles every row of the tile may fully see run without a mask; the remaining tiles up to
the causal edge run with the mask. Programs whose query tile is past their sequence's q_len
(short sequences in a batch with a long one) exit at once. Non-power-of-two G and D are padded
up (D at least 16, the smallest tl.dot) and masked.

Tile sizes come from ``kernel_config.pick_config``; random paged batches for tests and
benchmarks from ``paged_batch.make_paged_batch``. ``python -m l3_paged.attention_triton`` checks
the kernel against the reference on one mixed batch in three dtypes.
"""
from __future__ import annotations

import torch

from plumbing.runtime import INTERPRET  # noqa: F401  (import before triton: picks GPU or interpreter)
from plumbing.errors import UserError

import triton
import triton.language as tl

from l3_paged.kernel_config import KernelConfig, pick_config
from l3_paged.validate import check_paged_layout

LOG2E = 1.4426950408889634


@triton.jit
def _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_row, lo, hi, kv_len, limit, offs_d,
                  stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE: tl.constexpr, qk_scale,
                  HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASKED: tl.constexpr, UPCAST: tl.constexpr):
    """Online-softmax update over keys [lo, hi). MASKED: apply the causal / kv_len mask."""
    for start_n in range(lo, hi, BLOCK_N):
        n = start_n + tl.arange(0, BLOCK_N)                     # [N] logical key positions
        key_ok = n < kv_len
        # Block-table address arithmetic: logical key -> (physical block, offset in block).
        if MASKED:
            blk = tl.load(bt_row + n // BLOCK_SIZE, mask=key_ok, other=0)       # [N]
        else:
            blk = tl.load(bt_row + n // BLOCK_SIZE)                             # [N]
        slot = n % BLOCK_SIZE                                                   # [N]
        # int64 before multiplying: num_blocks * block stride can pass 2^31 elements.
        k_ptrs = k_base + blk.to(tl.int64)[:, None] * stride_kb + slot[:, None] * stride_ks \
            + offs_d[None, :]                                                   # [N, D_PAD]
        v_ptrs = v_base + blk.to(tl.int64)[:, None] * stride_vb + slot[:, None] * stride_vs \
            + offs_d[None, :]
        kv_mask = offs_d[None, :] < HEAD_DIM
        if MASKED:
            kv_mask = kv_mask & key_ok[:, None]   # never touch slots past kv_len (may be garbage)
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)                            # [N, D_PAD]
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)                            # [N, D_PAD]
        if UPCAST:  # Triton interpreter: tl.dot on bfloat16 is wrong on CPU, fp32 is exact
            k = k.to(tl.float32)
            v = v.to(tl.float32)

        # "ieee" keeps float32 inputs exact (TF32 would not); 16-bit inputs ignore it.
        s = tl.dot(q, tl.trans(k), input_precision="ieee")                      # [M, N] fp32, unscaled
        if MASKED:
            visible = (n[None, :] <= limit[:, None]) & key_ok[None, :]          # [M, N]
            s = tl.where(visible, s, float("-inf"))

        # Scale folded into one multiply-add per score (qk_scale = scale * log2 e > 0).
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)   # [M]; finite: key 0 is seen first
        alpha = tl.exp2(m_i - m_new)                        # [M]  rescale of the old state
        p = tl.exp2(s * qk_scale - m_new[:, None])          # [M, N]
        l_i = l_i * alpha + tl.sum(p, 1)
        # p @ v accumulates straight into the rescaled acc (the tensor-core accumulator).
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _paged_attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_q_ptr, kv_lens_ptr, bt_ptr, qk_scale,
                       stride_qt, stride_qh,                     # q   [T, H_q, D]
                       stride_kb, stride_ks, stride_kh,          # k   [num_blocks, block_size, H_kv, D]
                       stride_vb, stride_vs, stride_vh,          # v   same layout
                       stride_ot, stride_oh,                     # out [T, H_q, D]
                       stride_bt,                                # block_table [S, max_blocks]
                       BLOCK_SIZE: tl.constexpr,                 # cache block size: fixed per engine
                       G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                       D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                       UPCAST: tl.constexpr):
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    # Programs start in grid order, axis 0 fastest. The last query tiles of a causal prefill see
    # the most keys, so they go first, for every kv head (longest job first: a shorter tail).
    kv_head = tl.program_id(0)
    q_tile = tl.num_programs(1) - 1 - tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + seq)
    if q_tile * BLOCK_Q >= q_len:      # a short sequence in a batch sized for a longer one
        return
    # Rows of the tile: (query token, head in group) packed together.
    rows = tl.arange(0, BLOCK_M)
    tok = q_tile * BLOCK_Q + rows // G_PAD               # [M] query index within the sequence
    g = rows % G_PAD                                     # [M] head within the group
    head = kv_head * G + g                               # [M] query head
    row_ok = (tok < q_len) & (g < G)                     # padded tokens / padded heads
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    io_mask = row_ok[:, None] & d_ok[None, :]            # [M, D_PAD]
    q_ptrs = q_ptr + (q_start + tok).to(tl.int64)[:, None] * stride_qt \
        + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=io_mask, other=0.0)         # [M, D_PAD]
    if UPCAST:
        q = q.to(tl.float32)
    # Causal edge: row with token i sees keys 0 .. limit = kv_len - q_len + i (inclusive).
    limit = kv_len - q_len + tok                                         # [M]
    first_tok = q_tile * BLOCK_Q
    last_tok = tl.minimum(first_tok + BLOCK_Q, q_len) - 1
    full_hi = (kv_len - q_len + first_tok + 1) // BLOCK_N * BLOCK_N      # every row sees [0, full_hi)
    masked_hi = kv_len - q_len + last_tok + 1                            # some row sees [.., masked_hi)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    k_base = k_ptr + kv_head * stride_kh
    v_base = v_ptr + kv_head * stride_vh
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_row, 0, full_hi, kv_len,
                                  limit, offs_d, stride_kb, stride_ks, stride_vb, stride_vs,
                                  BLOCK_SIZE, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, False, UPCAST)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_row, full_hi, masked_hi,
                                  kv_len, limit, offs_d, stride_kb, stride_ks, stride_vb, stride_vs,
                                  BLOCK_SIZE, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, True, UPCAST)
    out = acc / l_i[:, None]                             # [M, D_PAD]; l > 0: key 0 always visible
    o_ptrs = o_ptr + (q_start + tok).to(tl.int64)[:, None] * stride_ot \
        + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=io_mask)


def paged_attention_triton(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table, *,
                           max_seqlen_q: int, scale=None, out=None, config: KernelConfig | None = None,
                           check: bool = True):
    """Paged attention for a whole batch in one launch. Returns ``out`` ``[T, H_q, D]``.

    ``max_seqlen_q`` (a host int, the longest query length in the batch) sizes the grid, so
    nothing here waits for the GPU. It is not checked against the metadata (that would need a
    sync); ``validate_paged_inputs(..., max_seqlen_q=...)`` checks it in --check mode.
    ``config`` overrides :func:`pick_config` (benchmarks and tuning).
    """
    if check:  # a caller that checks the layout once per step passes check=False
        check_paged_layout(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table)
    T, H_q, D = q.shape
    _, block_size, H_kv, _ = k_cache.shape
    if not 1 <= D <= 256:
        raise UserError(f"head_dim D={D} unsupported: the kernel handles 1..256")
    if not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        raise UserError(f"max_seqlen_q must be a host int >= 0 (got {max_seqlen_q!r}); "
                        "keep it on the host next to the metadata, never .item() it per layer")
    if out is None:
        out = torch.empty_like(q)                                        # [T, H_q, D]
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(-1) != 1:
        raise UserError(f"out must be a [T, H_q, D] {q.dtype} tensor on {q.device} with stride(-1)=1, "
                        f"got {tuple(out.shape)} {out.dtype} on {out.device}")
    S = seq_lens_kv.shape[0]
    if T == 0 or S == 0 or max_seqlen_q == 0:
        return out

    G = H_q // H_kv
    g_pad = triton.next_power_of_2(G)
    d_pad = max(16, triton.next_power_of_2(D))
    cfg = config or pick_config(max_seqlen_q, T, S, g_pad, d_pad, q.dtype)
    scale = D ** -0.5 if scale is None else float(scale)
    if not scale > 0:
        raise UserError(f"scale must be > 0 (got {scale}); the default is 1/sqrt(D)")
    grid = (H_kv, triton.cdiv(max_seqlen_q, cfg.block_q), S)
    if grid[1] > 65535 or S > 65535:
        raise UserError(f"grid {grid} exceeds CUDA's 65535 limit on axes 1/2: split the batch")
    _paged_attn_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, seq_lens_kv, block_table, scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        block_table.stride(0),
        BLOCK_SIZE=block_size,
        G=G, G_PAD=g_pad, HEAD_DIM=D, D_PAD=d_pad, BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n,
        UPCAST=INTERPRET and q.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


if __name__ == "__main__":
    from l3_paged.attention_ref import paged_attention_ref
    from l3_paged.paged_batch import make_paged_batch
    from l3_paged.validate import validate_paged_inputs

    device = "cuda" if torch.cuda.is_available() else "cpu"
    q_lens, kv_lens = [1, 5, 33], [300, 5, 90]        # a decode, a short prefill, a chunk on cached context
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)):
        args = make_paged_batch(q_lens, kv_lens, 8, 2, 64, 16, dtype, device)
        validate_paged_inputs(*args, max_seqlen_q=max(q_lens))
        out = paged_attention_triton(*args, max_seqlen_q=max(q_lens))
        ref = paged_attention_ref(*args)
        err = (out.float() - ref.float()).abs().max().item()
        ok = torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol)
        print(f"check {str(dtype):15s} max|kernel - ref| = {err:.2e}  (atol=rtol={tol:g})  "
              f"{'ok' if ok else 'FAIL'}")
    print("timings: python -m benchmarks.bench_attention (GPU); interpreter timings are not performance")
