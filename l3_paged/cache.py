"""Block-tensor KV storage, and the attention layer that reads it with one call per batch.

Per layer, K and V are ``[num_blocks, block_size, H_kv, D]``: the same bytes as stage 2's
``[num_slots, H_kv, D]``, addressed by block. Writes still use flat slots, through a zero-copy
view:

    K[layer]                       [num_blocks, block_size, H_kv, D]   what the kernel reads
    K[layer].view(-1, H_kv, D)     [num_blocks * block_size, H_kv, D]  what set_kv writes
    slot = block_id * block_size + offset  ==  row of the view

Without the ``.view`` the index ``K[layer][slot_mapping]`` would select whole *blocks*
(dim 0 is blocks), write T blocks' worth of garbage, or fail on shape.
"""
from __future__ import annotations

from l2_gather.pool import KVPool

from .attention_ref import paged_attention_ref
from .attention_triton import paged_attention_triton
from .metadata import PagedMeta
from .validate import validate_paged_inputs

IMPLS = ("torch", "triton")


class PagedKVCache(KVPool):
    """Stage 2's pool with another layout: same allocation and byte count, block-tensor shape."""

    def __init__(self, cfg, num_blocks: int, block_size: int, device, dtype, impl: str = "triton",
                 check: bool = False):
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        super().__init__(cfg, num_blocks, block_size, device, dtype)
        self.impl, self.check = impl, check

    @staticmethod
    def layer_shape(num_blocks, block_size, h_kv, d) -> tuple:
        return (num_blocks, block_size, h_kv, d)                 # [N, B, H_kv, D]: block-tensor

    def set_kv(self, layer, slot_mapping, k, v) -> None:
        set_kv_slots(self.K[layer], self.V[layer], slot_mapping, k, v)

    def attend(self, layer: int, q, k, v, meta: PagedMeta) -> torch.Tensor:
        self.set_kv(layer, meta.slot_mapping, k, v)
        args = (q, self.K[layer], self.V[layer], meta.cu_seqlens_q, meta.seq_lens_kv, meta.block_table)
        if self.check:  # host syncs: on in tests and --check, off in the hot path
            validate_paged_inputs(*args, max_seqlen_q=meta.max_seqlen_q)
        if self.impl == "torch":
            return paged_attention_ref(*args)                                  # [T, H_q, D]
        return paged_attention_triton(*args, max_seqlen_q=meta.max_seqlen_q)  # [T, H_q, D]


def set_kv_slots(K, V, slot_mapping, k, v) -> None:
    """Write k, v [T, H_kv, D] to T flat slots of one layer's block tensors [N, B, H_kv, D]."""
    _, _, h_kv, d = K.shape
    K.view(-1, h_kv, d)[slot_mapping] = k
    V.view(-1, h_kv, d)[slot_mapping] = v
