"""The KV cache of a windowed checkpoint: each layer's window and KV cache group (groups.py).

    groups (12, None, 12) -> full (1,) | W=12 (0,) | W=12 (2,)
    tensors                  K[1] is K[0] is K[2]: one shared tensor, block ids per group
    layer 1 (full)           group 0: the step's own block table, stage 7's attention
    layers 0, 2 (W = 12)     groups 1, 2: their own table and slots, this stage's kernels

    K[t], V[t]   [num_blocks + 1, block_size, H_kv, D] for t < group size; block num_blocks: PAD

The pool has ``pool_blocks`` blocks (groups.py): the memory stage 7 would give ``num_blocks``
blocks of every layer, cut into blocks of one group's layers. The cache answers the skeleton's
calls as stage 7's does (``attend``, ``rope_attend``, ``attend_cached``) with each layer's group
table and slots, and a windowed layer's kernels never load a key below the window.
``sliding_windows = True`` is what the skeleton asks of a KV object before it runs a windowed
checkpoint (l1_dense/model.py). A decode step that is split (``meta.num_splits > 1``) splits a
windowed layer's W keys the same way (attention_split.py).
"""
from __future__ import annotations

from l3_paged.cache import set_kv_slots
from l3_paged.validate import check_paged_layout
from l7_fast.attention_split import pick_num_splits
from l7_fast.cache import attend_paged, norm_args
from l7_fast.fused_rope import qk_norm_rope_write

from .attention import paged_attention_window, window_attention_ref
from .attention_split import paged_attention_window_split
from .groups import KVGroup, group_of, group_size, layer_slots, layer_tensors, request_blocks


class WindowedKVCache:
    sliding_windows = True

    def __init__(self, cfg, groups: list[KVGroup], num_blocks: int, block_size: int, device, dtype,
                 impl: str = "triton"):
        """``num_blocks``: the shared pool's blocks (each holds one group's layers)."""
        shape = (num_blocks + 1, block_size, cfg.num_kv_heads, cfg.head_dim)      # [N + PAD, B, H_kv, D]
        self.groups, self.slots = groups, layer_slots(groups, cfg.num_layers)     # layer -> (group, tensor)
        self.K, self.V = layer_tensors(groups, cfg.num_layers, shape, device, dtype)   # shared by the groups
        n = group_size(groups)
        self.block_size, self.impl, self.num_blocks = block_size, impl, num_blocks
        self.pad_block, self.pad_slot = num_blocks, num_blocks * block_size
        self.bytes_per_block = 2 * n * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize

    @property
    def nbytes(self) -> int:
        unique = {id(t): t for t in self.K + self.V}.values()
        return sum(t.numel() * t.element_size() for t in unique)

    def num_splits(self, batch: int, max_kv_len: int, num_sms: int) -> int:
        return pick_num_splits(batch, self.K[0].shape[2], max_kv_len, num_sms)     # stage 7's rule

    def request_blocks(self, n_tokens: int, chunk: int) -> int:
        """The most blocks one request of ``n_tokens`` holds, in every group (groups.py)."""
        return request_blocks(n_tokens, self.block_size, chunk, self.groups)

    def check_layout(self, q, cu_seqlens_q, seq_lens_kv, block_table) -> None:
        check_paged_layout(q, self.K[0], self.V[0], cu_seqlens_q, seq_lens_kv, block_table)

    def set_kv(self, layer: int, slot_mapping, k, v) -> None:
        set_kv_slots(self.K[layer], self.V[layer], slot_mapping, k, v)

    def attend(self, layer: int, q, k, v, meta):                    # the torch ops path (TorchOps)
        self.set_kv(layer, group_of(meta, self.slots[layer][0])[1], k, v)
        return self.attend_cached(layer, q, meta)

    def rope_attend(self, attn, q, k, v, cos, sin, meta, pdl: bool = False):   # the fused ops path
        layer = attn.layer_idx
        slots = group_of(meta, self.slots[layer][0])[1]
        q = qk_norm_rope_write(q, k, v, cos, sin, self.K[layer], self.V[layer], slots, pdl=pdl, **norm_args(attn))
        return self.attend_cached(layer, q, meta)

    def attend_cached(self, layer: int, q, meta):
        g = self.slots[layer][0]
        table = group_of(meta, g)[0]
        window = self.groups[g].window
        if window is None:
            return attend_paged(q, self.K[layer], self.V[layer], meta, table, self.impl)
        args = (q, self.K[layer], self.V[layer], meta.cu_seqlens_q, meta.seq_lens_kv, table)
        if self.impl == "torch":
            return window_attention_ref(*args, window=window)
        if meta.num_splits > 1:
            return paged_attention_window_split(*args, max_seqlen_q=meta.max_seqlen_q, window=window,
                                                num_splits=meta.num_splits)
        return paged_attention_window(*args, max_seqlen_q=meta.max_seqlen_q, window=window)
