"""The skeleton's ops seam (l1_dense/model.py ``TorchOps``) for batch-invariant steps: every matmul
through matmul.py, every norm through stage 7's per-row kernel.

    op               stage 7's FusedOps                      InvariantOps
    add_rms_norm     fused kernel, or a GEMV prologue        fused kernel (fused_norm.py), always
    qkv, o_proj,     GEMV for M <= 2, cuBLAS above           matmul.py for every M
    gate_up, down
    SiLU * up        GEMV epilogue, or fused_act             fused_act.silu_mul (elementwise)
    rope_attend      the cache's rope_attend                 the same (the cache part picks attention)
    lm_head          cuBLAS (model.lm_head, an nn.Linear)    ``InvariantLMHead``: matmul.py

The lm_head is not an op of the seam (the skeleton calls ``model.lm_head(h)``), so ``InvariantOps``
gives the model an lm_head module of its own over the same weight, as fused ops merge the q/k/v
weights: the module is swapped, no method is.
"""
from __future__ import annotations

import torch
from torch import nn

from l7_fast import fused_act
from l7_fast.fused_norm import add_rms_norm, rms_norm
from l7_fast.ops import merge_projections
from plumbing.errors import UserError

from .matmul import matmul


class InvariantLMHead(nn.Module):
    """``h [S, hidden] -> logits [S, vocab]`` by matmul.py: a row's logits whatever S is."""

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight                        # the same Parameter (tied to the embedding where it was)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return matmul(h.contiguous(), self.weight)


class InvariantOps:
    """``model.forward(ids, kv, meta, ops=InvariantOps(model))``: TorchOps' five ops with the same
    rounding points, each row's bits independent of the step's other rows."""

    pdl = False                                     # the runner asks; these kernels do not wait on PDL

    def __init__(self, model):
        if not isinstance(model.lm_head, (nn.Linear, InvariantLMHead)):
            raise UserError(f"batch_invariant needs the model's own lm_head (an nn.Linear), got "
                            f"{type(model.lm_head).__name__}: run it with tensor_parallel_size=1")
        merge_projections(model)
        if isinstance(model.lm_head, nn.Linear):
            model.lm_head = InvariantLMHead(model.lm_head.weight)

    def add_rms_norm(self, delta, h, norm):
        if delta is None:
            return h, rms_norm(h, norm.weight, norm.eps)
        x, h = add_rms_norm(delta, h, norm.weight, norm.eps, residual_out=h)   # h updated in place
        return h, x

    def matmul(self, x, weight, bias=None, silu_mul: bool = False):
        y = matmul(x.contiguous() if x.stride(-1) != 1 else x, weight, bias)
        return fused_act.silu_mul(y) if silu_mul else y

    def qkv(self, attn, x):
        return self.matmul(x, attn.qkv_weight, attn.qkv_bias).split(attn.qkv_sizes, dim=-1)

    def rope_attend(self, attn, q, k, v, cos, sin, kv, meta):
        return kv.rope_attend(attn, q, k, v, cos, sin, meta)

    def gate_up_act(self, mlp, x):
        return self.matmul(x, mlp.gate_up_weight, silu_mul=True)

    def linear(self, lin, x):
        return self.matmul(x, lin.weight, lin.bias)
