"""RMSNorm, and RMSNorm fused with the residual add before it, as one Triton kernel each.

The spec is stage 1's torch path (l1_dense/model.py), which rounds like Hugging Face:

    DecoderLayer:  h = h + sublayer(...)             the add in the model dtype (one rounding)
    RMSNorm:       x32 = h.float()
                   y   = x32 * rsqrt(mean(x32^2) + eps)      float32
                   out = weight * y.to(dtype)                cast FIRST, then scale (a 2nd rounding)

So in bf16 the kernel rounds exactly where the torch path does: the residual sum to bf16, the
normalised row to bf16, the product with the weight to bf16. What it cannot copy is the order of
the float32 sum of squares (and torch's rsqrt vs Triton's): those differ by an ulp of float32,
which moves a bf16 result by one bf16 ulp in rare elements. Tolerances: fp32 1e-5, fp16 1e-3,
bf16 1.5e-2; the benchmark prints the fraction of bit-equal elements too.

    x          [M, N]  the sublayer output (or the hidden state, plain variant); any row stride
    residual   [M, N]  the running hidden state h
    weight     [N]
    out        [M, N]  rmsnorm(residual + x) * weight
    residual_out [M, N]  residual + x (may be ``residual`` itself: updated in place)

Grid: (M,). One program owns one row: it loads the row once (and the residual row), writes the
new residual, reduces the sum of squares in float32 and writes the scaled row. BLOCK = N rounded
up to a power of two, so a row is one tile (N <= 65536). Bytes: read 2MN + N, write 2MN
(plain: read MN + N, write MN) against the torch path's ~6 passes over the row.
"""
from __future__ import annotations

import torch

from plumbing.runtime import INTERPRET  # noqa: F401  (import before triton: picks GPU or interpreter)
from plumbing.errors import UserError
from l1_dense.model import RMSNorm

import triton
import triton.language as tl

from l3_paged.validate import FLOAT_DTYPES


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, o_ptr, ro_ptr, inv_n, eps, N,
                     stride_x, stride_r, stride_o, stride_ro,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)                                        # [BLOCK]
    ok = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)   # [BLOCK] model dtype
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=ok, other=0.0)
        # h + sublayer(h): one add, rounded to the model dtype (torch adds in float32, then rounds)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(ro_ptr + row * stride_ro + cols, x, mask=ok)
    xf = x.to(tl.float32)
    # mean as torch takes it: sum * (1/N), the factor a float32 (padding columns are 0)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, 0) * inv_n + eps)
    y = (xf * rstd).to(x_ptr.dtype.element_ty)                        # normalise, cast back...
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    out = y.to(tl.float32) * w.to(tl.float32)                         # ...then scale, and round
    tl.store(o_ptr + row * stride_o + cols, out.to(o_ptr.dtype.element_ty), mask=ok)


def _check_2d(name, t, like):
    if t.dim() != 2 or t.shape != like.shape or t.stride(1) != 1:
        raise UserError(f"{name} must be [M, N] = {tuple(like.shape)} with stride(1) == 1, "
                        f"got {tuple(t.shape)} strides {t.stride()}")
    if t.dtype != like.dtype or t.device != like.device:
        raise UserError(f"{name} is {t.dtype} on {t.device}; x is {like.dtype} on {like.device}")


def _launch(x, residual, weight, eps, out, residual_out):
    if x.dim() != 2 or x.stride(1) != 1:
        raise UserError(f"x must be [M, N] with stride(1) == 1, got {tuple(x.shape)} strides {x.stride()}")
    if x.dtype not in FLOAT_DTYPES:
        raise UserError(f"x dtype {x.dtype} unsupported: use float32, float16 or bfloat16")
    M, N = x.shape
    if weight.shape != (N,) or weight.dtype != x.dtype or weight.device != x.device or weight.stride(0) != 1:
        raise UserError(f"weight must be a contiguous [{N}] {x.dtype} tensor on {x.device} (the model's "
                        f"dtype, as the torch path multiplies in it), got {tuple(weight.shape)} {weight.dtype}")
    if not 1 <= N <= 65536:
        raise UserError(f"N={N} unsupported: one row is one tile, 1..65536")
    out = torch.empty_like(x) if out is None else out
    _check_2d("out", out, x)
    if residual is not None:
        _check_2d("residual", residual, x)
        residual_out = torch.empty_like(x) if residual_out is None else residual_out
        _check_2d("residual_out", residual_out, x)
    if M == 0:
        return out, residual_out
    block = triton.next_power_of_2(N)
    r, ro = (residual, residual_out) if residual is not None else (x, x)   # unused when no residual
    _rms_norm_kernel[(M,)](
        x, r, weight, out, ro, 1.0 / N, float(eps), N,
        x.stride(0), r.stride(0), out.stride(0), ro.stride(0),
        HAS_RESIDUAL=residual is not None, BLOCK=block,
        num_warps=4 if block <= 2048 else 8 if block <= 8192 else 16,
        enable_fp_fusion=False)   # no a * b + c -> fma: torch's eager ops round every product
    return out, residual_out


def rms_norm(x, weight, eps, *, out=None):
    """``rmsnorm(x) * weight`` rounded as l1_dense's RMSNorm. x [M, N] -> [M, N]; ``out`` may be x."""
    return _launch(x, None, weight, eps, out, None)[0]


def add_rms_norm(x, residual, weight, eps, *, out=None, residual_out=None):
    """``h = residual + x`` (model dtype), then ``rmsnorm(h) * weight``. Returns ``(out, h)``.
    ``residual_out=residual`` updates the residual in place (each program reads its row first)."""
    return _launch(x, residual, weight, eps, out, residual_out)


# --- The reference: stage 1's torch ops, as the decoder layer calls them. ----------------------
def add_rms_norm_ref(x, residual, norm: RMSNorm):
    """h = residual + x  (read 2MN, write MN), then norm(h) (read MN ~4 times, write MN ~4 times)."""
    h = residual + x
    return norm(h), h
