"""float8_e4m3fn, the KV cache's storage format: the format, the reference quantizer, and the
bits decoded and encoded by hand for the Triton interpreter.

One byte: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits. "fn": finite, no infinity; the
one NaN per sign is 0x7F / 0xFF (exponent 15, mantissa 7), so the largest value is 448.

    exponent field e   mantissa m   value
    1 .. 15            0 .. 7       (1 + m/8) * 2^(e - 7)     normal: 2^-6 .. 448, 3 significant bits
    0                  0 .. 7       (m/8) * 2^-6 = m * 2^-9    subnormal: 0, 2^-9 .. 7 * 2^-9
    15                 7            NaN

A value is stored as round(x / scale) in e4m3 and read back as e4m3 * scale. The scale is what
keeps x / scale inside [-448, 448] and, for small values, out of the coarse subnormal range:

    per tensor       one scale per layer for K and one for V (vLLM's k_scale / v_scale; 1.0 unless a
                     checkpoint calibrated them)
    per token-head   scale = amax(|x|) / 448 over each token's head (D values), computed when the
                     token is written: the largest entry lands on 448, every vector uses the full range

Two things the hardware conversion does that a hand-written one must too: values beyond 448
saturate (``clamp`` before the cast; an overflowing cast is NaN in some libraries), and rounding
is to nearest, ties to even, subnormals included. The Triton interpreter (triton 3.9) gets the
encode wrong for about 1 value in 9 (subnormals flushed, a mantissa carry into the exponent lost:
-31.25 became -16) and decodes NaN as 480, so under the interpreter the kernels call
``e4m3_encode`` / ``e4m3_decode`` below: the same bits from plain arithmetic.
"""
from __future__ import annotations

import torch

from plumbing.exercise import learner_can_replace
from plumbing.runtime import INTERPRET  # noqa: F401  (import before triton: picks GPU or interpreter)

import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALES = ("tensor", "token")          # per-tensor (vLLM's) or per token and head


def e4m3_refusal(device_type: str, capability: tuple[int, int] | None, interpret: bool) -> str | None:
    """Why this device cannot run the e4m3 kernels, or None. Triton compiles float8_e4m3fn (its
    "fp8e4nv") for compute capability 8.9 and newer only (Ada, Hopper): on an A100 (8.0) or an
    RTX 30xx (8.6) the kernels would fail to compile at the first step ("type fp8e4nv not supported
    in this architecture"; harness/gpu_compile.py --arch 80 shows it). A CPU runs them through the
    interpreter."""
    if device_type != "cuda" or interpret or capability is None or tuple(capability) >= (8, 9):
        return None
    return (f"the e4m3 KV cache's Triton kernels need compute capability 8.9 or newer (Ada, Hopper), and this "
            f"GPU is {capability[0]}.{capability[1]}")


@learner_can_replace
def quantize_kv(x: torch.Tensor, scale: torch.Tensor | None):
    """``x`` [T, H, D] (any float dtype) -> (codes [T, H, D] float8_e4m3fn, scale [T, H] float32).

    ``scale`` given ([T, H] float32, the per-tensor value broadcast): divide by it. ``None``: per
    token and head, scale = amax(|x|) / 448 over D, and 1.0 for an all-zero vector.
    The division and the clamp are in float32; the cast rounds to nearest, ties to even.
    """
    xf = x.float()
    if scale is None:
        scale = xf.abs().amax(-1) / FP8_MAX
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    codes = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return codes, scale


def dequantize_kv(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """codes [..., D] e4m3, scale [...] -> float32 values codes * scale."""
    return codes.float() * scale[..., None]


@triton.jit
def e4m3_decode(bits):
    """uint8 e4m3 bits -> float32, by hand (the interpreter reads 0x7F as 480, not NaN)."""
    b = bits.to(tl.int32)
    e = (b >> 3) & 15
    m = (b & 7).to(tl.float32)
    mag = tl.where(e == 0, m * 0.001953125, (8.0 + m) * tl.exp2((e - 10).to(tl.float32)))   # 2^-9; (8+m) 2^(e-10)
    mag = tl.where((e == 15) & (m == 7.0), float("nan"), mag)
    return tl.where(b >= 128, -mag, mag)


@triton.jit
def e4m3_encode(x):
    """float32 in [-448, 448] -> uint8 e4m3 bits, round to nearest, ties to even, by hand.

    The spacing of e4m3 values near |x| is 2^(E - 3), E = floor(log2 |x|), and never finer than the
    subnormals' 2^-9. Round |x| to a multiple of it; the result is an exact e4m3 value, whose
    exponent is taken again (rounding may carry into the next power of two: 15.5 -> 16).
    """
    a = tl.abs(x)
    step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), -6.0) - 3.0)   # at most: the subnormal step
    t = a / step                                                        # exact: step is a power of two
    r = tl.floor(t + 0.5)
    r = tl.where((r - t == 0.5) & (r % 2.0 == 1.0), r - 1.0, r)         # a tie goes to the even neighbour
    y = r * step
    e = tl.floor(tl.log2(tl.maximum(y, 0.015625)))                      # y's exponent (>= -6)
    normal = (e + 7.0) * 8.0 + (y / tl.exp2(e) - 1.0) * 8.0
    code = tl.where(y >= 0.015625, normal, y * 512.0)                   # subnormal: y / 2^-9
    return (code + tl.where(x < 0, 128.0, 0.0)).to(tl.uint8)
