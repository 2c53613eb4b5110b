"""The KV cache part of batch-invariant mode: stage 7's storage, this stage's attention.

    storage       stage 7's FastKVCache (its block tensors, PAD block, fused RoPE + K/V write),
                  held, not extended
    attend_cached attention.py's kernel for every step: cut points at fixed key positions, so a
                  decode, a verification and a prefill chunk reduce a position's keys alike
    num_splits    split programs of a decode step (host ints): every split of the longest context
                  while the fold grid leaves SMs idle (attention.splits_for); any answer, same bits

Model-dtype caches of full-attention checkpoints only: windowed layers and e4m3 storage run their
own kernels (stages 8 and 9), which this mode does not replace yet.
"""
from __future__ import annotations

from l7_fast.cache import FastKVCache, norm_args
from l7_fast.fused_rope import qk_norm_rope_write
from l3_paged.attention_ref import paged_attention_ref

from .attention import paged_attention_invariant, splits_for


class InvariantKVCache:
    def __init__(self, cfg, num_blocks: int, block_size: int, device, dtype, impl: str = "triton"):
        self.store = FastKVCache(cfg, num_blocks, block_size, device, dtype, impl=impl)

    def __getattr__(self, name):                    # K, V, block_size, pad_block, pad_slot, request_blocks, ...
        if name == "store":
            raise AttributeError(name)
        return getattr(self.store, name)

    def num_splits(self, batch: int, max_kv_len: int, num_sms: int) -> int:
        return splits_for(batch, self.store.K[0].shape[2], max_kv_len, num_sms)   # K: [blocks, block, H_kv, D]

    def attend(self, layer: int, q, k, v, meta):                # the torch ops path
        self.store.set_kv(layer, meta.slot_mapping, k, v)
        return self.attend_cached(layer, q, meta)

    def rope_attend(self, attn, q, k, v, cos, sin, meta, pdl: bool = False):
        layer = attn.layer_idx
        q = qk_norm_rope_write(q, k, v, cos, sin, self.store.K[layer], self.store.V[layer], meta.slot_mapping,
                               **norm_args(attn))
        return self.attend_cached(layer, q, meta)

    def attend_cached(self, layer: int, q, meta):
        args = (q, self.store.K[layer], self.store.V[layer], meta.cu_seqlens_q, meta.seq_lens_kv, meta.block_table)
        if self.store.impl == "torch":
            return paged_attention_ref(*args)
        return paged_attention_invariant(*args, max_seqlen_q=meta.max_seqlen_q,
                                         num_splits=getattr(meta, "num_splits", 1), check=False)
