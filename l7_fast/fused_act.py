"""SiLU(gate) * up, the SwiGLU activation, as one Triton kernel.

The spec is stage 1's MLP (l1_dense/model.py): ``F.silu(gate_proj(x)) * up_proj(x)``. In the
model dtype torch rounds twice, and so does the kernel:

    s   = silu(g) = g / (1 + exp(-g))    computed in float32, rounded to the model dtype
    out = s * u                          computed in float32, rounded to the model dtype

The input is the output of ONE merged projection, gate and up side by side (vLLM's
``gate_up_proj``): one matmul instead of two, and the kernel reads both halves of a row.

    gate_up  [M, 2I]   gate = gate_up[:, :I], up = gate_up[:, I:]; any row stride
    out      [M, I]

Grid: (M, cdiv(I, BLOCK)). Each program owns BLOCK columns of one row. Bytes: read 2MI, write
MI; the torch path moves 6MI (silu reads and writes MI, the multiply reads 2MI and writes MI).
exp and the division are Triton's float32 ones, not torch's, so a bf16 element can move by one
bf16 ulp where the float32 silu sits on a rounding boundary. Tolerances: fp32 1e-5, fp16 1e-3,
bf16 1.5e-2.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from plumbing.runtime import INTERPRET
from plumbing.errors import UserError

import triton
import triton.language as tl

from l3_paged.validate import FLOAT_DTYPES


@triton.jit
def _silu_mul_kernel(x_ptr, o_ptr, I, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)              # [BLOCK]
    ok = cols < I
    g = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + I + cols, mask=ok, other=0.0)
    s = (g / (1.0 + tl.exp(-g))).to(o_ptr.dtype.element_ty)            # F.silu: float32, then round
    out = s.to(tl.float32) * u.to(tl.float32)                           # the multiply: round again
    tl.store(o_ptr + row * stride_o + cols, out.to(o_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up, *, out=None):
    """``silu(gate_up[:, :I]) * gate_up[:, I:]`` -> ``[M, I]``, rounded as l1_dense's MLP."""
    if gate_up.dim() != 2 or gate_up.stride(1) != 1 or gate_up.shape[1] % 2:
        raise UserError(f"gate_up must be [M, 2I] with stride(1) == 1 (gate half, then up half), "
                        f"got {tuple(gate_up.shape)} strides {gate_up.stride()}")
    if gate_up.dtype not in FLOAT_DTYPES:
        raise UserError(f"gate_up dtype {gate_up.dtype} unsupported: use float32, float16 or bfloat16")
    M, I = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        out = torch.empty(M, I, dtype=gate_up.dtype, device=gate_up.device)
    elif (out.shape != (M, I) or out.stride(1) != 1 or out.dtype != gate_up.dtype
          or out.device != gate_up.device):
        raise UserError(f"out must be [{M}, {I}] {gate_up.dtype} on {gate_up.device} with stride(1) == 1, "
                        f"got {tuple(out.shape)} {out.dtype}")
    if M == 0 or I == 0:
        return out
    # The interpreter pays per program, not per element: one program per row there.
    block = triton.next_power_of_2(I) if INTERPRET else min(1024, triton.next_power_of_2(I))
    _silu_mul_kernel[(M, triton.cdiv(I, block))](gate_up, out, I, gate_up.stride(0), out.stride(0),
                                                 BLOCK=block, num_warps=4,
                                                 enable_fp_fusion=False)   # round as eager torch does
    return out


def silu_mul_ref(gate_up):
    """The torch path: silu reads MI and writes MI, the multiply reads 2MI and writes MI."""
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u                      # l1_dense MLP.forward, with gate/up from one matmul
