"""The matmuls of a small step (M <= GEMV_MAX_M rows) as one Triton kernel each, SwiGLU fused in.

A decode step of one sequence multiplies a [1, K] row by every weight matrix of the model: pure
weight streaming, 2 bytes read per 2 flops. cuBLAS picks tensor-core tiles of 64 x 8 for it and,
where K is long, splits K over programs and launches a second kernel to add the parts. On the
H100 the four matmuls of a Qwen3-0.6B layer ran at ~45% of copy bandwidth that way, and were
half of the GPU time of a single-stream step (``bench_l7.py``'s profile, lessons/l7_fast/6_gemv.md).

This kernel is the textbook GEMV: no tensor cores, no split-K.

    x [M, K] (any row stride)   W [N, K] (nn.Linear's layout)   bias [N] or None   ->  y [M, N]

    Grid (cdiv(N, BLOCK_N),). A program owns BLOCK_N output columns for all M rows. It streams
    its BLOCK_N rows of W once, BLOCK_K columns at a time, multiplies each [BLOCK_N, BLOCK_K]
    chunk by the matching [M, BLOCK_K] chunk of x (a few KB, read from L2 by every program) and
    sums over K in float32: BLOCK_M x BLOCK_N x BLOCK_K products in registers per chunk.

Bytes: N*K weights read once (the floor), M*K per program from L2, M*N written. Flops: 2*M*N*K
on the CUDA cores, which is why M stops at GEMV_MAX_M: past it the products outgrow the bytes
and cuBLAS's tensor cores win (``bench_l7_kernels.py --kernel gemv`` measures where).

``silu_mul=True``: W is the merged [gate; up] weight [2I, K] (ops.merge_projections) and the
output [M, I] is silu(x @ gate^T) * (x @ up^T). A program computes BLOCK_N gate columns and the
same up columns, rounds both to the model dtype as the matmul would, then applies
fused_act.silu_mul's arithmetic: the activation kernel and its [M, 2I] round trip are gone.

``norm_weight`` (+ ``delta``): the input is rmsnorm(h + delta) * weight, the add + RMSNorm that
fused_norm.py runs as its own kernel, computed in this kernel's prologue (lessons/l7_fast/6_gemv.md): every
program reads all of h and delta (a few KB, from L2), sums the squares, normalises its chunk
and multiplies; program 0 writes h + delta for the rest of the layer. When a row of K is one
chunk (ONE_CHUNK: K <= BLOCK_K, the usual case) the weights are loaded first, so their stream
from HBM overlaps the norm; otherwise a first pass over the input computes each row's rstd.
The norm rounds where fused_norm.py does (with FMA contraction off, as there).

Rounding: one float32 sum per output, rounded once (with the bias added first), like cuBLAS; the
order of the sum differs, so float32 agrees to ~1e-6 and a bf16 output moves by one ulp where
its sum sits on a rounding boundary. Tolerances: fp32 1e-5, fp16 1e-3, bf16 1.5e-2.
"""
from __future__ import annotations

import torch

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError

import triton
import triton.language as tl

from l3_paged.validate import FLOAT_DTYPES

from .pdl import check_pdl, let_next_start, wait_for_previous

#: The largest M FusedOps gives this kernel; more rows go to cuBLAS. Measured on the H100
#: (``bench_l7_kernels.py --kernel gemv``, lessons/l7_fast/6_gemv.md), a Qwen3-0.6B layer's four matmuls: at
#: M = 1 the GEMV beats cuBLAS on all four (1.06-1.34x), at M = 2 on three, and the four together
#: take 27 µs against 32; at M = 4 they tie (32 vs 31), and past that the products outgrow what a
#: few warps do while the bytes stream.
GEMV_MAX_M = 2


@triton.jit
def _residual(x_rows, d_rows, k, k_ok, m_ok, HAS_DELTA: tl.constexpr):
    """A [BLOCK_M, BLOCK_K] chunk of x, or with HAS_DELTA of h + delta (one rounding, as torch adds)."""
    ok = m_ok[:, None] & k_ok[None, :]
    x = tl.load(x_rows + k[None, :], mask=ok, other=0.0)
    if HAS_DELTA:
        x = (x.to(tl.float32) + tl.load(d_rows + k[None, :], mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _normalise(h, rstd, nw_ptr, k, k_ok):
    """rmsnorm(h) * weight on a chunk, given each row's rstd: rounded where fused_norm.py rounds."""
    y = (h.to(tl.float32) * rstd[:, None]).to(h.dtype)                   # normalise, cast back...
    nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0)
    return (y.to(tl.float32) * nw.to(tl.float32)[None, :]).to(h.dtype)   # ...then scale, and round


@triton.jit
def _keep_residual(h, ho_ptr, m, k, k_ok, m_ok, stride_ho):
    """Program 0 writes h + delta: the residual stream the layer goes on with."""
    if tl.program_id(0) == 0:
        tl.store(ho_ptr + m.to(tl.int64)[:, None] * stride_ho + k[None, :], h, mask=m_ok[:, None] & k_ok[None, :])


@triton.jit
def _rstd(h, inv_k, eps):
    hf = h.to(tl.float32)
    return tl.math.rsqrt(tl.sum(hf * hf, 1) * inv_k + eps)              # mean as torch takes it: sum * (1/K)


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(x_ptr, w_ptr, b_ptr, o_ptr, M, N, K, stride_x, stride_w, stride_o,
                 d_ptr, nw_ptr, ho_ptr, stride_d, stride_ho, inv_k, eps,
                 HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, NORM: tl.constexpr, HAS_DELTA: tl.constexpr,
                 ONE_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr):
    let_next_start(PDL)             # the next kernel may start now: its weight loads overlap this one
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)              # [BLOCK_N] output columns
    m = tl.arange(0, BLOCK_M)                                            # [BLOCK_M] rows of x
    n_ok, m_ok = n < N, m < M
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_w                  # [BLOCK_N, 1]
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_x                  # [BLOCK_M, 1]
    d_rows = d_ptr + m.to(tl.int64)[:, None] * stride_d                  # HAS_DELTA only
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if NORM and not ONE_CHUNK:      # a first pass over the input (a few KB, from L2) for each row's rstd
        wait_for_previous(PDL)
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            h = _residual(x_rows, d_rows, k, k < K, m_ok, HAS_DELTA)
            if HAS_DELTA:
                _keep_residual(h, ho_ptr, m, k, k < K, m_ok, stride_ho)
            hf = h.to(tl.float32)
            ss += tl.sum(hf * hf, 1)
        rstd = tl.math.rsqrt(ss * inv_k + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)              # SILU_MUL only
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)                                   # [BLOCK_K]
        k_ok = k < K
        w_ok = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + k[None, :], mask=w_ok, other=0.0)          # the weights first: their
        if SILU_MUL:                                                     # loads overlap the prologue
            u = tl.load(w_rows + N * stride_w + k[None, :], mask=w_ok, other=0.0)   # (up rows: N below)
        wait_for_previous(PDL)      # the weights are in flight; x comes from the kernel before (pdl.py)
        x = _residual(x_rows, d_rows, k, k_ok, m_ok, HAS_DELTA)
        if NORM:
            if ONE_CHUNK:                                                # the whole row is here: rstd now
                if HAS_DELTA:
                    _keep_residual(x, ho_ptr, m, k, k_ok, m_ok, stride_ho)
                rstd = _rstd(x, inv_k, eps)
            x = _normalise(x, rstd, nw_ptr, k, k_ok)
        x = x.to(tl.float32)
        acc += tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)                # [BLOCK_M, BLOCK_N]
        if SILU_MUL:
            acc_up += tl.sum(x[:, None, :] * u.to(tl.float32)[None, :, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = acc.to(o_ptr.dtype.element_ty)                                 # the matmul's rounding
    if SILU_MUL:                                                         # fused_act.silu_mul, same steps
        g = out.to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(o_ptr.dtype.element_ty)
        up = acc_up.to(o_ptr.dtype.element_ty)
        out = (s.to(tl.float32) * up.to(tl.float32)).to(o_ptr.dtype.element_ty)
    o = o_ptr + m.to(tl.int64)[:, None] * stride_o + n[None, :]
    tl.store(o, out, mask=m_ok[:, None] & n_ok[None, :])


def gemv_block_m(M: int) -> int | None:
    """The BLOCK_M a step of M rows compiles for (a power of two), or None: cuBLAS takes it."""
    return triton.next_power_of_2(M) if 1 <= M <= GEMV_MAX_M else None


def gemv_config(block_m: int, N: int, K: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) from host ints only, after the H100 sweep at M = 1 and 2: a
    row's K in one chunk when it fits (every load of a program in flight at once), 4 rows of W
    per program (2 past K = 2048, with 8 warps: down_proj's 3,072), <= 128 float32 products a thread."""
    if INTERPRET:                                       # the interpreter pays per program: few, large
        return min(64, triton.next_power_of_2(N)), min(256, triton.next_power_of_2(K)), 4
    block_k = min(triton.next_power_of_2(K), 4096, 8192 // block_m)
    return (2, block_k, 8) if block_k > 2048 else (4, block_k, 4)


def _check_norm(x, delta, norm_weight, residual_out):
    """The prologue's tensors: delta and residual_out like x, norm_weight [K] in x's dtype."""
    K = x.shape[1]
    if norm_weight is None:
        if delta is not None or residual_out is not None:
            raise UserError("delta and residual_out belong to the norm prologue: pass norm_weight too")
        return
    if norm_weight.shape != (K,) or norm_weight.dtype != x.dtype or norm_weight.stride(0) != 1:
        raise UserError(f"norm_weight must be a contiguous [{K}] {x.dtype} tensor, got {tuple(norm_weight.shape)} "
                        f"{norm_weight.dtype}")
    if (delta is None) != (residual_out is None):
        raise UserError("the residual add needs both delta and residual_out (h + delta is written there)")
    for name, t in (("delta", delta), ("residual_out", residual_out)):
        if t is not None and (t.shape != x.shape or t.stride(1) != 1 or t.dtype != x.dtype or t.device != x.device):
            raise UserError(f"{name} must be {tuple(x.shape)} {x.dtype} on {x.device} with stride(1) == 1, "
                            f"got {tuple(t.shape)} {t.dtype}")
    if residual_out is not None and residual_out.data_ptr() in (x.data_ptr(), delta.data_ptr()):
        raise UserError("residual_out must be a new buffer: every program reads h and delta while program 0 writes it")


def gemv(x, weight, bias=None, *, silu_mul: bool = False, out=None, config=None,
         norm_weight=None, eps: float = 1e-6, delta=None, residual_out=None, pdl: bool = False):
    """``x @ weight.T + bias`` for a few rows (FusedOps sends M <= GEMV_MAX_M; the benchmark goes
    to 64 to find the crossover); with ``silu_mul`` the SwiGLU of a merged [gate; up] weight:
    ``silu(x @ gate.T) * (x @ up.T)``. Rounded as F.linear (and silu_mul). ``config``:
    (BLOCK_N, BLOCK_K, num_warps) instead of gemv_config's (the benchmark's sweep).

    With ``norm_weight`` the input is ``rmsnorm(x + delta) * norm_weight`` (fused_norm.add_rms_norm,
    computed in the prologue: x is the residual stream h), and ``h + delta`` is written to
    ``residual_out``; without ``delta`` the input is ``rmsnorm(x) * norm_weight``.

    ``pdl`` (Hopper on; pdl.py): launched with programmatic dependent launch, the kernel lets the
    next one start at once and waits for the one before only after issuing its weight loads, so
    one GEMV's weights stream while the previous kernel finishes (lessons/l7_fast/9_pdl.md)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise UserError(f"x must be [M, K] with stride(1) == 1, got {tuple(x.shape)} strides {x.stride()}")
    if x.dtype not in FLOAT_DTYPES:
        raise UserError(f"x dtype {x.dtype} unsupported: use float32, float16 or bfloat16")
    M, K = x.shape
    if not 1 <= M <= 64:
        raise UserError(f"gemv takes 1..64 rows, got {M}: use F.linear (cuBLAS) for more")
    if (weight.dim() != 2 or weight.shape[1] != K or weight.stride(1) != 1 or weight.dtype != x.dtype
            or weight.device != x.device):
        raise UserError(f"weight must be [N, {K}] {x.dtype} on {x.device} with stride(1) == 1, "
                        f"got {tuple(weight.shape)} {weight.dtype}")
    N = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    if silu_mul and (weight.shape[0] % 2 or bias is not None):
        raise UserError(f"silu_mul needs a merged [gate; up] weight [2I, K] and no bias, got {tuple(weight.shape)}")
    if bias is not None and (bias.shape != (N,) or bias.dtype != x.dtype or bias.stride(0) != 1):
        raise UserError(f"bias must be a contiguous [{N}] {x.dtype} tensor, got {tuple(bias.shape)} {bias.dtype}")
    _check_norm(x, delta, norm_weight, residual_out)
    if out is None:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    elif out.shape != (M, N) or out.stride(1) != 1 or out.dtype != x.dtype or out.device != x.device:
        raise UserError(f"out must be [{M}, {N}] {x.dtype} on {x.device} with stride(1) == 1, got {tuple(out.shape)}")
    check_pdl(pdl, x.device)
    block_m = triton.next_power_of_2(M)
    block_n, block_k, warps = config or gemv_config(block_m, N, K)
    norm = norm_weight is not None
    d, ho = (delta, residual_out) if delta is not None else (x, x)     # unused without the residual add
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, weight if bias is None else bias, out, M, N, K, x.stride(0), weight.stride(0), out.stride(0),
        d, norm_weight if norm else weight, ho, d.stride(0), ho.stride(0), 1.0 / K, float(eps),
        HAS_BIAS=bias is not None, SILU_MUL=silu_mul, NORM=norm, HAS_DELTA=delta is not None, ONE_CHUNK=norm and K <= block_k,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, num_warps=warps, launch_pdl=pdl,
        enable_fp_fusion=not norm)   # the norm rounds every product as torch's eager ops do (fused_norm.py)
    return out
