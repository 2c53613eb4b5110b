"""Stage 7's fused ops, with the K/V write that quantizes (write.py).

Only one op changes: ``rope_attend``, whose kernel writes K and V into the cache. Every other
kernel (norms, matmuls, SiLU) is stage 7's, and attention is the cache's (cache.py).
"""
from __future__ import annotations

from l7_fast.ops import FusedOps

from .write import rope_write_fp8


class Fp8Ops(FusedOps):
    """``FusedOps`` for an ``Fp8KVCache``: norm, RoPE and e4m3 quantization in one write kernel."""

    def rope_attend(self, attn, q, k, v, cos, sin, kv, meta):
        layer, norm = attn.layer_idx, hasattr(attn, "q_norm")
        q = rope_write_fp8(q, k, v, cos, sin, kv.K[layer], kv.V[layer], kv.k_scale[layer], kv.v_scale[layer],
                           kv.slot_mapping(layer, meta), per_token=kv.per_token,
                           q_norm_weight=attn.q_norm.weight if norm else None,
                           k_norm_weight=attn.k_norm.weight if norm else None,
                           eps=attn.q_norm.eps if norm else 1e-6)
        return kv.attend_cached(layer, q, meta)
