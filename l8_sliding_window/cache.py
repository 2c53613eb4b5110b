"""Stage 7's KV cache, told each layer's window and KV cache group.

    groups (12, None, 12) -> full (1,) | W=12 (0,) | W=12 (2,)     groups.py
    tensors                  K[1] is K[0] is K[2]: one shared tensor, block ids per group
    layer 1 (full)           group 0: meta.block_table, stage 7's path (split-KV included)
    layers 0, 2 (W = 12)     groups 1, 2: their own table and slots, stage 8's kernels

The pool has ``pool_blocks`` blocks (groups.py): the memory stage 7 would give ``num_blocks``
blocks of every layer, cut into blocks of one group's layers. ``sliding_windows = True`` is what
the skeleton asks of a KV object before it runs a windowed checkpoint (l1_dense/model.py). A
decode step that stage 7 splits (``meta.num_splits > 1``) splits a windowed layer's W keys the
same way (attention_split.py).
"""
from __future__ import annotations

import dataclasses

from l7_fast.cache import FastKVCache, FastMeta

from .attention import paged_attention_window, window_attention_ref
from .attention_split import paged_attention_window_split
from .groups import KVGroup, group_size, layer_slots


class WindowedKVCache(FastKVCache):
    sliding_windows = True

    def __init__(self, cfg, groups: list[KVGroup], num_blocks: int, block_size: int, device, dtype,
                 impl: str = "triton"):
        """``num_blocks``: the shared pool's blocks (each holds one group's layers)."""
        tensors = dataclasses.replace(cfg, num_layers=group_size(groups), layer_windows=())
        super().__init__(tensors, num_blocks, block_size, device, dtype, impl=impl)
        self.groups, self.slots = groups, layer_slots(groups, cfg.num_layers)
        self.K = [self.K[t] for _, t in self.slots]          # layer -> its group's tensor (shared)
        self.V = [self.V[t] for _, t in self.slots]

    @property
    def nbytes(self) -> int:
        unique = {id(t): t for t in self.K + self.V}.values()
        return sum(t.numel() * t.element_size() for t in unique)

    def slot_mapping(self, layer: int, meta: FastMeta):
        g = self.slots[layer][0]
        return meta.group_slots[g] if g else meta.slot_mapping

    def attend_cached(self, layer: int, q, meta: FastMeta):
        g = self.slots[layer][0]
        table = meta.group_tables[g] if g else meta.block_table
        window = self.groups[g].window
        if window is None:
            return super().attend_cached(layer, q, meta if not g else dataclasses.replace(meta, block_table=table))
        args = (q, self.K[layer], self.V[layer], meta.cu_seqlens_q, meta.seq_lens_kv, table)
        if self.impl == "torch":
            return window_attention_ref(*args, window=window)
        if meta.num_splits > 1:
            return paged_attention_window_split(*args, max_seqlen_q=meta.max_seqlen_q, window=window,
                                                num_splits=meta.num_splits)
        return paged_attention_window(*args, max_seqlen_q=meta.max_seqlen_q, window=window)
