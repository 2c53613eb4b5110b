"""Split-KV ("flash-decoding") paged attention for decode steps: small batch, long context.

Stage 3's kernel gives one program to each (kv head, query tile, sequence). A decode step has
one query tile per sequence, so batch 1 of Qwen3-0.6B (H_kv = 8) runs 8 programs on a GPU of 132
SMs, each walking all 32768 keys alone: 6% of copy bandwidth. Here the keys of each sequence are
cut into NUM_SPLITS contiguous chunks, one program per chunk, and a second kernel merges them.

Same inputs and math as stage 3 (l3_paged/attention_ref.py is the spec), for decode-only steps
(every q_len is 1, so query row s belongs to sequence s):

    q [S, H_q, D];  k/v_cache [num_blocks, block_size, H_kv, D];  seq_lens_kv [S];  block_table [S, *]

1. Split kernel, grid (H_kv, NUM_SPLITS, S). Sequence s's keys go in chunks of
   chunk = cdiv(cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N; program (h, i, s) takes keys
   [i * chunk, min((i + 1) * chunk, kv_len)) (none: it exits) for the G query heads of kv head h,
   with stage 3's online-softmax loop (``_attend_tiles``, imported), and writes its partial state
   un-normalised, in float32 and the log2 domain:

       m[s, h, i]      = max_j  score_j                       score_j = q . k_j * scale * log2(e)
       l[s, h, i]      = sum_j  2^(score_j - m)
       acc[s, h, i, :] = sum_j  2^(score_j - m) v_j           partials [S, H_q, NUM_SPLITS(, D)]

2. Merge kernel, grid (S, H_q): the n = cdiv(kv_len, chunk) valid splits combine exactly,

       M = max_i m_i,   w_i = 2^(m_i - M),   out = sum_i w_i acc_i / sum_i w_i l_i

   which is the softmax over all keys: each split's terms are rescaled to one common maximum.

NUM_SPLITS is a host int (``pick_num_splits``: from S, H_kv, the SM count and a host-side bound
on the context length), so choosing it never waits for the GPU, and with a fixed NUM_SPLITS one
launch serves any lengths (a CUDA graph can capture it). Steps with a prefill chunk, and decode
steps that already fill the GPU, go to stage 3's kernel unchanged.
Extra bytes: the partials, S * H_q * NUM_SPLITS * (D + 2) * 4 written and read once; at 1 x 32768
with 64 splits that is 0.5 MB against 134 MB of K/V.
"""
from __future__ import annotations

import functools

import torch

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError

import triton
import triton.language as tl

from l3_paged.attention_triton import LOG2E, _attend_tiles, paged_attention_triton
from l3_paged.kernel_config import KernelConfig, pick_config
from l3_paged.validate import check_paged_layout

from .pdl import check_pdl, let_next_start, wait_for_previous

MIN_KEYS_PER_SPLIT = 64    # below this a split's fixed cost (q load, partial write) dominates (H100: 1 x 4,096
                           # ran 15.6 us at 16 splits of 256 keys, 13.3 us at 64 of 64; docs/benchmarks.md)
WAVES = 3                  # programs per SM to aim for (pick_num_splits rounds up from it)
MAX_SPLITS = 128
SHORT_SPLIT = 512          # a split of at most this many keys takes 32-key steps (split_config)


@triton.jit
def _split_chunk(kv_len, num_splits, BLOCK_N: tl.constexpr):
    """Keys per split for one sequence: an even share, rounded up to whole key tiles."""
    return tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N


@triton.jit(do_not_specialize=["num_splits"])   # a runtime int: no variant per split count
def _split_kv_kernel(q_ptr, k_ptr, v_ptr, acc_ptr, m_ptr, l_ptr, kv_lens_ptr, bt_ptr, qk_scale, num_splits,
                     stride_qt, stride_qh,                     # q   [S, H_q, D]
                     stride_kb, stride_ks, stride_kh,          # k   [num_blocks, block_size, H_kv, D]
                     stride_vb, stride_vs, stride_vh,          # v   same layout
                     stride_bt,                                # block_table [S, max_blocks]
                     BLOCK_SIZE: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr,
                     HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                     UPCAST: tl.constexpr, PDL: tl.constexpr):
    let_next_start(PDL)                  # pdl.py: the merge may launch now, and waits for every split
    wait_for_previous(PDL)               # q (and the new token's K/V) come from the rope kernel
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2)
    k_head = k_ptr + kv_head * stride_kh                 # this kv head's K and V, and the sequence's
    v_head = v_ptr + kv_head * stride_vh                 # block-table row: what stage 3's loop walks
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    kv_len = tl.load(kv_lens_ptr + seq)
    chunk = _split_chunk(kv_len, num_splits, BLOCK_N)
    lo = split * chunk
    if lo >= kv_len:                     # a short sequence uses fewer splits; the merge knows
        return
    hi = tl.minimum(lo + chunk, kv_len)
    full_hi = lo + (hi - lo) // BLOCK_N * BLOCK_N        # [lo, full_hi) unmasked, [full_hi, hi) masked

    # Rows: the G query heads of this kv head, padded to ROWS >= 16 (the smallest tl.dot).
    rows = tl.arange(0, ROWS)
    head = kv_head * G + rows                            # [ROWS] query head
    row_ok = rows < G
    offs_d = tl.arange(0, D_PAD)
    io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=io_mask, other=0.0)                 # [ROWS, D_PAD]
    if UPCAST:
        q = q.to(tl.float32)
    limit = tl.zeros([ROWS], tl.int32) + kv_len - 1      # decode: the one query sees every key

    # Stage 3's online-softmax state and loop, over this split's keys only: whole tiles unmasked,
    # then the tail tile (if any) masked at kv_len.
    acc, l_i, m_i = tl.zeros([ROWS, D_PAD], tl.float32), tl.zeros([ROWS], tl.float32), \
        tl.full([ROWS], float("-inf"), tl.float32)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_head, v_head, bt_row, lo, full_hi, kv_len, limit,
                                  offs_d, stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE,
                                  qk_scale, HEAD_DIM, D_PAD, BLOCK_N, False, UPCAST)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_head, v_head, bt_row, full_hi, hi, kv_len, limit,
                                  offs_d, stride_kb, stride_ks, stride_vb, stride_vs, BLOCK_SIZE,
                                  qk_scale, HEAD_DIM, D_PAD, BLOCK_N, True, UPCAST)

    part = (seq.to(tl.int64) * (tl.num_programs(0) * G) + head) * num_splits + split   # [ROWS]
    tl.store(m_ptr + part, m_i, mask=row_ok)
    tl.store(l_ptr + part, l_i, mask=row_ok)
    tl.store(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=io_mask)


@triton.jit(do_not_specialize=["num_splits"])
def _merge_kernel(acc_ptr, m_ptr, l_ptr, o_ptr, kv_lens_ptr, num_splits, stride_ot, stride_oh,
                  HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
                  BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    let_next_start(PDL)                  # the o_proj GEMV may launch now: its weights load meanwhile
    wait_for_previous(PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_len = tl.load(kv_lens_ptr + seq)
    n_valid = tl.cdiv(kv_len, _split_chunk(kv_len, num_splits, BLOCK_N))   # splits that ran
    sp = tl.arange(0, SPLITS_PAD)
    ok = sp < n_valid
    part = (seq.to(tl.int64) * tl.num_programs(1) + head) * num_splits + sp  # [SPLITS_PAD]
    m = tl.load(m_ptr + part, mask=ok, other=float("-inf"))
    l = tl.load(l_ptr + part, mask=ok, other=0.0)
    w = tl.where(ok, tl.exp2(m - tl.max(m, 0)), 0.0)     # [SPLITS_PAD] rescale to the common max
    offs_d = tl.arange(0, D_PAD)
    acc = tl.load(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)   # [SPLITS_PAD, D_PAD]
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)                    # [D_PAD]
    tl.store(o_ptr + seq.to(tl.int64) * stride_ot + head * stride_oh + offs_d,
             out.to(o_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 16                    # the interpreter: any fixed number, the choice is host-only
    return torch.cuda.get_device_properties(device).multi_processor_count


def pick_num_splits(num_seqs: int, num_kv_heads: int, max_kv_len: int, num_sms: int) -> int:
    """Splits per sequence, from host ints only. 1 while the unsplit grid already has a program
    per SM; otherwise enough for WAVES programs per SM, rounded up to a power of two, but at least
    MIN_KEYS_PER_SPLIT keys each (so a short bound can cap it below a power of two). A power of two cuts
    a power-of-two context into equal chunks of whole tiles (H100, Qwen3-8B heads, 64-key steps:
    1 x 32,768 at 64 splits 60.8 us, at 50 61.2; 8 x 8,192 at 8 splits 104.0, at 7 105.2)."""
    base = num_seqs * num_kv_heads
    if base >= num_sms:
        return 1
    want = triton.next_power_of_2(triton.cdiv(WAVES * num_sms, base))
    return max(1, min(want, max_kv_len // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


def split_config(num_seqs: int, g_pad: int, d_pad: int, dtype: torch.dtype,
                 keys_per_split: int | None = None) -> KernelConfig:
    """Tiles of the split kernel: stage 3's decode tiles, but 64-key steps for 16-bit D <= 128
    (half the shared memory per program, so more programs per SM stream at once), and 32-key steps
    where a split holds at most SHORT_SPLIT keys (``keys_per_split``: the host's bound on the
    context over the split count). H200 sweep, Qwen3-0.6B heads, CUDA-graph timing: best were 64
    splits x 64 keys at 1 x 32768 (66% of copy bandwidth; 128-key steps 66% at 32 splits) and 8
    splits x 64 keys at 8 x 8192 (82%; 128 keys 73%) (benchmarks/results/bench_l7_kernels/h200.md).
    H100, Qwen3-8B heads: 1 x 4,096 at 64 splits 13.3 us with 32-key steps, 14.4 with 64; 1 x
    32,768 at 64 splits 59.5 and 60.8; 8 x 8,192 at 8 splits 104.3 and 104.0 (1,024 keys a split)."""
    cfg = pick_config(1, num_seqs, num_seqs, g_pad, d_pad, dtype)
    if INTERPRET or dtype == torch.float32 or d_pad > 128:
        return cfg
    short = keys_per_split is not None and keys_per_split <= SHORT_SPLIT
    return KernelConfig(cfg.block_q, block_n=32 if short else 64, num_warps=4, num_stages=2)


def _merge(acc, m, l, out, seq_lens_kv, num_splits, block_n, pdl=False):
    """Launch the merge (module-level so a test can plant a wrong one and see the tests fail)."""
    S, H_q, _, D = acc.shape
    _merge_kernel[(S, H_q)](acc, m, l, out, seq_lens_kv, num_splits, out.stride(0), out.stride(1),
                            HEAD_DIM=D, D_PAD=max(16, triton.next_power_of_2(D)),
                            SPLITS_PAD=triton.next_power_of_2(num_splits), BLOCK_N=block_n, PDL=pdl,
                            num_warps=4, launch_pdl=pdl)


def paged_attention_split(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table, *, max_seqlen_q: int,
                          max_seqlen_kv: int | None = None, num_splits: int | None = None, scale=None,
                          out=None, config: KernelConfig | None = None, check: bool = True, pdl: bool = False):
    """Paged attention that splits the keys of decode steps. Returns ``out`` ``[T, H_q, D]``.

    Host ints decide everything: a step with ``max_seqlen_q > 1`` (prefill chunks) or
    ``num_splits == 1`` runs stage 3's kernel. ``max_seqlen_kv`` bounds the context length for the
    split choice; without it the block table's width (``block_table.shape[1] * block_size``) does.
    ``num_splits`` overrides :func:`pick_num_splits`; ``config`` overrides :func:`split_config`.
    ``pdl``: both kernels with programmatic dependent launch (pdl.py; stage 3's kernel never).
    """
    check_pdl(pdl, q.device)
    if check:  # the engine checks the layout once per step (FastRunner), not in every layer
        check_paged_layout(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table)
    T, H_q, D = q.shape
    _, block_size, H_kv, _ = k_cache.shape
    S = seq_lens_kv.shape[0]
    l3 = dict(max_seqlen_q=max_seqlen_q, scale=scale, out=out, config=config, check=False)
    if max_seqlen_q != 1 or T != S:      # not decode-only (T == S with q_len <= 1: every q_len is 1)
        return paged_attention_triton(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table, **l3)
    max_kv = block_table.shape[1] * block_size if max_seqlen_kv is None else max_seqlen_kv
    if num_splits is None:
        num_splits = pick_num_splits(S, H_kv, max_kv, _num_sms(q.device))
    if not isinstance(num_splits, int) or not 1 <= num_splits <= 65535:
        raise UserError(f"num_splits must be a host int in 1..65535, got {num_splits!r}")
    if num_splits == 1 or not 1 <= D <= 256:
        return paged_attention_triton(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table, **l3)
    if out is None:
        out = torch.empty_like(q)                                        # [S, H_q, D]
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(-1) != 1:
        raise UserError(f"out must be a [T, H_q, D] {q.dtype} tensor on {q.device} with stride(-1)=1")
    if S > 65535:
        raise UserError(f"S={S} exceeds CUDA's 65535 grid limit on axis 2: split the batch")
    G = H_q // H_kv
    d_pad = max(16, triton.next_power_of_2(D))
    cfg = config or split_config(S, triton.next_power_of_2(G), d_pad, q.dtype, triton.cdiv(max_kv, num_splits))
    scale = D ** -0.5 if scale is None else float(scale)
    if not scale > 0:
        raise UserError(f"scale must be > 0 (got {scale}); the default is 1/sqrt(D)")
    f32 = dict(device=q.device, dtype=torch.float32)
    acc = torch.empty(S, H_q, num_splits, D, **f32)                     # un-normalised partial outputs
    m, l = torch.empty(S, H_q, num_splits, **f32), torch.empty(S, H_q, num_splits, **f32)
    _split_kv_kernel[(H_kv, num_splits, S)](
        q, k_cache, v_cache, acc, m, l, seq_lens_kv, block_table, scale * LOG2E, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        BLOCK_SIZE=block_size, G=G, ROWS=max(16, triton.next_power_of_2(G)), HEAD_DIM=D, D_PAD=d_pad,
        BLOCK_N=cfg.block_n, UPCAST=INTERPRET and q.dtype == torch.bfloat16, PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl)
    _merge(acc, m, l, out, seq_lens_kv, num_splits, cfg.block_n, pdl)
    return out
