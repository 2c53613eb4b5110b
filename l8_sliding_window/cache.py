"""Stage 7's KV cache, told each layer's window: a windowed layer attends with stage 8's kernel.

    layer_windows = (20, 20)          Mistral: every layer through paged_attention_window
    layer_windows = (12, None, 12)    hybrid: layer 1 through stage 7's path (split-KV included)

``sliding_windows = True`` is what the skeleton asks of a KV object before it runs a windowed
checkpoint (l1_dense/model.py). A decode step that stage 7 splits (``meta.num_splits > 1``)
splits a windowed layer's W keys the same way (attention_split.py).
"""
from __future__ import annotations

from l7_fast.cache import FastKVCache, FastMeta

from .attention import paged_attention_window, window_attention_ref
from .attention_split import paged_attention_window_split


class WindowedKVCache(FastKVCache):
    sliding_windows = True

    def __init__(self, cfg, num_blocks: int, block_size: int, device, dtype, impl: str = "triton"):
        super().__init__(cfg, num_blocks, block_size, device, dtype, impl=impl)
        self.windows = cfg.layer_windows or (None,) * cfg.num_layers

    def attend_cached(self, layer: int, q, meta: FastMeta):
        window = self.windows[layer]
        if window is None:
            return super().attend_cached(layer, q, meta)
        args = (q, self.K[layer], self.V[layer], meta.cu_seqlens_q, meta.seq_lens_kv, meta.block_table)
        if self.impl == "torch":
            return window_attention_ref(*args, window=window)
        if meta.num_splits > 1:
            return paged_attention_window_split(*args, max_seqlen_q=meta.max_seqlen_q, window=window,
                                                num_splits=meta.num_splits)
        return paged_attention_window(*args, max_seqlen_q=meta.max_seqlen_q, window=window)
