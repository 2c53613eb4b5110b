"""An M-invariant matmul: row i of ``x @ W^T`` is the same bits whatever M is.

cuBLAS (and stage 7's choice between its GEMV and cuBLAS) picks a kernel, a tile and a split of K
from M, so one token's row is summed in another order in a step of 1 token than in a step of 300.
Here the sum over K has one shape for every M, fixed by the weight alone:

    x [M, K] (row stride any, unit column stride)   W [N, K] (nn.Linear's layout)   bias [N] | None
    y [M, N] = x @ W^T + bias,  in x's dtype

    K is cut into chunks of K_CHUNK (a multiple of BLOCK_K), each chunk summed BLOCK_K at a time
    into a fresh float32 tile, the chunks added in order:

        y[i, j] = round( (...((0 + c_0) + c_1) + ... + c_last) + bias[j] )
        c_r     = dot(x[i, kr_0], W[j, kr_0]) (+)= dot(x[i, kr_1], W[j, kr_1]) ...   (tl.dot, BLOCK_K wide)

    Every row runs the same tensor-core instructions over the same K steps, and never meets another
    row's values. What fixes the bits is where K is cut (K_CHUNK), never the tile: on the GPU a
    tl.dot chained on one accumulator adds its 16-wide K slices in order whatever BLOCK_M, BLOCK_N
    or BLOCK_K is. Measured, not promised: benchmarks/studies/l13_tiles.py ran 70 tiles (BLOCK_M 16
    to 128, BLOCK_N 32 to 256, BLOCK_K 64 and 128, 4 or 8 warps, 3 or 4 stages) at six shapes on an
    H100, and every one gave the reference tile's bits; tests/test_l13_gpu.py checks the tiles the
    host picks on every GPU it runs on. So the host may pick a tile by M, for speed (``pick_tile``),
    while K_CHUNK stays fixed. Under the interpreter a tile is one NumPy dot, whose order is
    NumPy's: there the tile is fixed too (REFERENCE).

Two launches compute exactly that sum, and the host picks by M (any choice gives the same bits):

    fold   grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)): a program walks every chunk and adds them
           in registers. No extra bytes: the prefill path.
    split  grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), chunks): a program per chunk writes c_r in
           float32; ``_sum_chunks_kernel`` adds them in chunk order with the same epilogue. For a
           decode step (M <= 64) whose fold grid has fewer than two programs per SM: more programs
           stream the weights. Extra bytes: 8 * M * N * chunks (write + read), M/256 of the weights'
           2 * N * K at K_CHUNK = 1024 (bf16).

This is split-K made invariant: the cut points depend on K, never on M, and the parts meet in one
order (never atomics). What it costs against cuBLAS is measured by benchmarks/bench_batch_invariant.py.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError

import triton
import triton.language as tl

from l3_paged.validate import FLOAT_DTYPES

BLOCK_K = 64          # the interpreter's K step (tests may plant another through ``block_k``)
K_CHUNK = 1024        # K per chunk: the sum's shape, and the split launch's unit of work (a multiple of BLOCK_K)


class Tile(NamedTuple):
    """A launch's shape: rows and columns of W per program, K per step, warps, pipeline stages."""
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int


REFERENCE = Tile(64, 64, BLOCK_K, 4, 3)       # the interpreter's one tile (NumPy's dot sums a tile its own way)


def pick_tile(M: int, N: int, sms: int) -> Tile:
    """Speed only: the tile does not change a row's bits on the GPU (see the module's docstring).
    Decode-sized M: 16 or 64 rows, 32 columns (programs for every SM, K 128 a step); a middle M:
    64 rows and the widest columns that still fill the SMs; prefill: 128 x 128 or 128 x 256
    (benchmarks/studies/l13_tiles.py timed 70 tiles at six shapes on an H100)."""
    if INTERPRET:
        return REFERENCE
    if M <= 64:
        return Tile(16 if M <= 16 else 64, 32, 128, 4, 4)
    if M <= 256:
        bn = next((b for b in (128, 64) if triton.cdiv(M, 64) * triton.cdiv(N, b) >= sms), 32)
        return Tile(64, bn, 64 if bn == 128 else 128, 8 if bn == 128 else 4, 4)
    bn = 256 if triton.cdiv(M, 128) * triton.cdiv(N, 256) >= sms else 128
    return Tile(128, bn, 64, 8, 3 if bn == 256 else 4)


@triton.jit
def _epilogue(total, b_ptr, c_ptr, rm, rn, M, N, stride_cm, HAS_BIAS: tl.constexpr):
    """The one rounding: + bias in float32, cast, store (the fold and the chunk sum share it)."""
    if HAS_BIAS:
        total += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    ok = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :], total.to(c_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["M"])
def _chunked_matmul_kernel(a_ptr, w_ptr, b_ptr, c_ptr, p_ptr, M, N, K, stride_am, stride_wn, stride_cm,
                           HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           K_CHUNK: tl.constexpr, UPCAST: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)             # [BM] rows of x
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)             # [BN] rows of W
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * stride_am               # [BM, 1]
    w_cols = w_ptr + rn.to(tl.int64)[None, :] * stride_wn               # [1, BN]: W^T's columns
    if SPLIT:
        c_lo = tl.program_id(2)
        c_hi = c_lo + 1
    else:
        c_lo = 0
        c_hi = tl.cdiv(K, K_CHUNK)
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for c in range(c_lo, c_hi):
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)           # a fresh tile per chunk
        for k0 in range(c * K_CHUNK, tl.minimum(c * K_CHUNK + K_CHUNK, K), BLOCK_K):
            k = k0 + rk
            if EVEN_K:
                a = tl.load(a_rows + k[None, :], mask=m_ok[:, None], other=0.0)         # [BM, BK]
                w = tl.load(w_cols + k[:, None], mask=n_ok[None, :], other=0.0)         # [BK, BN]
            else:
                k_ok = k < K
                a = tl.load(a_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_cols + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if UPCAST:                   # the interpreter's tl.dot is wrong on bfloat16 (plumbing/runtime.py)
                a, w = a.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision="ieee")
        total += acc                                                     # chunks meet in order
    if SPLIT:                           # this chunk's part, float32: parts [chunks, M, N]
        parts = p_ptr + tl.program_id(2).to(tl.int64) * M * N
        tl.store(parts + rm.to(tl.int64)[:, None] * N + rn[None, :], total, mask=m_ok[:, None] & n_ok[None, :])
    else:
        _epilogue(total, b_ptr, c_ptr, rm, rn, M, N, stride_cm, HAS_BIAS)


@triton.jit(do_not_specialize=["M"])
def _sum_chunks_kernel(p_ptr, b_ptr, c_ptr, M, N, chunks, stride_cm, HAS_BIAS: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The split launch's second half: parts [chunks, M, N] added in chunk order, then the epilogue."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (rm < M)[:, None] & (rn < N)[None, :]
    offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for c in range(0, chunks):
        total += tl.load(p_ptr + c * M * N + offs, mask=ok, other=0.0)
    _epilogue(total, b_ptr, c_ptr, rm, rn, M, N, stride_cm, HAS_BIAS)


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 16                    # the interpreter: any fixed number, the choice is host-only
    return torch.cuda.get_device_properties(device).multi_processor_count


def wants_split(M: int, N: int, K: int, tile: Tile, sms: int, k_chunk: int = K_CHUNK) -> bool:
    """Split a decode-sized step (M <= 64, its float32 parts a few KB) whose fold grid has fewer than
    two programs per SM, where K has more than one chunk (host ints). The interpreter: below one per SM."""
    programs = triton.cdiv(M, tile.bm) * triton.cdiv(N, tile.bn)
    if INTERPRET:
        return programs < sms and K > k_chunk
    return M <= 64 and programs < 2 * sms and K > k_chunk


def _check(x, weight, bias):
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise UserError(f"matmul takes x [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype not in FLOAT_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise UserError(f"matmul needs one float dtype for x, weight and bias, got {x.dtype}, {weight.dtype}"
                        f"{'' if bias is None else ', ' + str(bias.dtype)}")
    if weight.device != x.device or (bias is not None and bias.device != x.device):
        raise UserError(f"x, weight and bias must be on one device (x is on {x.device})")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise UserError("x and weight need unit column stride (call .contiguous())")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise UserError(f"bias must be a contiguous [N={weight.shape[0]}] vector, got {tuple(bias.shape)}")


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, split: bool | None = None,
           k_chunk: int = K_CHUNK, block_k: int | None = None, tile: Tile | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` [M, N], each row's bits independent of M. ``split`` and ``tile``: None
    lets the host choose (``wants_split``, ``pick_tile``); given, they force a launch (tests: any
    choice gives the same bits), except that ``split=True`` runs the fold where K is one chunk
    (there is nothing to split). ``k_chunk`` and ``block_k`` exist so a test can plant a reduction
    shape chosen from M (under the interpreter, where ``block_k`` is the tile's K step)."""
    _check(x, weight, bias)
    M, K = x.shape
    N = weight.shape[0]
    tile = tile or pick_tile(M, N, num_sms(x.device))
    if block_k is not None:
        tile = tile._replace(bk=block_k)
    if k_chunk % tile.bk or tile.bk < 16 or tile.bk & (tile.bk - 1):
        raise UserError(f"k_chunk ({k_chunk}) must be a multiple of block_k ({tile.bk}), a power of two >= 16")
    out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M == 0 or N == 0:
        return out
    chunks = triton.cdiv(K, k_chunk)
    if split is None:
        split = wants_split(M, N, K, tile, num_sms(x.device), k_chunk)
    split = bool(split) and chunks > 1
    parts = torch.empty(chunks, M, N, device=x.device, dtype=torch.float32) if split else out   # [chunks, M, N]
    b = bias if bias is not None else out
    grid = (triton.cdiv(M, tile.bm), triton.cdiv(N, tile.bn)) + ((chunks,) if split else ())
    _chunked_matmul_kernel[grid](x, weight, b, out, parts, M, N, K, x.stride(0), weight.stride(0), out.stride(0),
                                 HAS_BIAS=bias is not None, SPLIT=split, EVEN_K=K % tile.bk == 0, BLOCK_M=tile.bm,
                                 BLOCK_N=tile.bn, BLOCK_K=tile.bk, K_CHUNK=k_chunk,
                                 UPCAST=INTERPRET and x.dtype == torch.bfloat16,
                                 num_warps=tile.warps, num_stages=tile.stages)
    if split:
        _sum_chunks_kernel[grid[:2]](parts, b, out, M, N, chunks, out.stride(0), HAS_BIAS=bias is not None,
                                     BLOCK_M=tile.bm, BLOCK_N=tile.bn, num_warps=4)
    return out


if __name__ == "__main__":
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(192, 2048 + 64, generator=g).to(device, dtype)       # [N, K]: three chunks, a short one
    x = torch.randn(70, w.shape[1], generator=g).to(device, dtype)      # [M, K]
    full = matmul(x, w)
    same = all(torch.equal(matmul(x[:m], w, split=s)[:m], full[:m]) for m in (1, 5, 64, 70) for s in (False, True))
    err = (full.float() - x.float() @ w.float().T).abs().max().item()
    print(f"{device} {dtype}: rows bitwise equal for M in 1, 5, 64, 70, fold and split: {same}; "
          f"max |ours - fp32 torch| = {err:.2e}")
    print("timings and cuBLAS's own variance: python -m benchmarks.bench_batch_invariant (GPU)")
