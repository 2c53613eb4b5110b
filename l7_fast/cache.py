"""Stage 3's block-tensor KV cache with one scratch block, and attention that splits the keys.

    K[layer], V[layer]   [num_blocks + 1, block_size, H_kv, D]
                          blocks 0 .. num_blocks - 1: the scheduler's;  block num_blocks: PAD

A CUDA graph is captured for a fixed batch of B rows, and a step with n < B requests replays it
with B - n padding rows. Those rows must read and write *somewhere* harmless: their slot is in
the PAD block, their block-table row is all PAD and their K/V length is 1. The scheduler never
hands the PAD block out, so padding never touches a request's K/V.

``attend_cached`` is the attention half of stage 3's ``attend``: with the fused ops, the
q/k-norm + RoPE kernel has already written k and v into the cache (ops.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from l3_paged.attention_ref import paged_attention_ref
from l3_paged.attention_triton import paged_attention_triton
from l3_paged.cache import PagedKVCache
from l3_paged.metadata import PagedMeta
from l3_paged.validate import check_paged_layout

from .attention_split import paged_attention_split, pick_num_splits


@dataclass
class FastMeta(PagedMeta):
    max_seqlen_kv: int = 0            # host int: bounds the context, for the split choice
    num_splits: int = 1               # host int: key splits per sequence in decode steps (1: stage 3's kernel)
    pdl: bool = False                 # the split kernels with programmatic dependent launch (pdl.py)


class FastKVCache(PagedKVCache):
    def __init__(self, cfg, num_blocks: int, block_size: int, device, dtype, impl: str = "triton"):
        super().__init__(cfg, num_blocks + 1, block_size, device, dtype, impl=impl, check=False)
        self.pad_block = num_blocks                      # the last block: scratch for padding rows
        self.pad_slot = num_blocks * block_size

    def num_splits(self, batch: int, max_kv_len: int, num_sms: int) -> int:
        """Key splits of a decode step of ``batch`` sequences (host ints). The cache decides: its
        attention kernel's tile sets how many programs an SM streams at once (stage 9's differs)."""
        return pick_num_splits(batch, self.K[0].shape[2], max_kv_len, num_sms)          # K: [blocks, block, H_kv, D]

    def slot_mapping(self, layer: int, meta: FastMeta):
        """The slots ``layer``'s new K/V are written to. The cache owns the addressing, so the fused
        write (ops.py) asks it: here every layer uses the step's one mapping."""
        return meta.slot_mapping

    def check_layout(self, q, cu_seqlens_q, seq_lens_kv, block_table) -> None:
        """--check: the step's attention inputs against this cache (the runner asks the cache, which
        knows its storage: stage 9's holds e4m3 codes, not q's dtype)."""
        check_paged_layout(q, self.K[0], self.V[0], cu_seqlens_q, seq_lens_kv, block_table)

    def attend(self, layer: int, q, k, v, meta: FastMeta):     # the torch ops path (TorchOps)
        self.set_kv(layer, self.slot_mapping(layer, meta), k, v)
        return self.attend_cached(layer, q, meta)

    def attend_cached(self, layer: int, q, meta: FastMeta):
        args = (q, self.K[layer], self.V[layer], meta.cu_seqlens_q, meta.seq_lens_kv, meta.block_table)
        if self.impl == "torch":
            return paged_attention_ref(*args)
        if meta.num_splits > 1:
            return paged_attention_split(*args, max_seqlen_q=meta.max_seqlen_q, num_splits=meta.num_splits,
                                         check=False, pdl=meta.pdl)
        return paged_attention_triton(*args, max_seqlen_q=meta.max_seqlen_q, check=False)
