"""The KV cache of the fast engine: stage 3's block tensors with one scratch block, written by the
fused RoPE kernel and read by attention that splits the keys.

    K[layer], V[layer]   [num_blocks + 1, block_size, H_kv, D]
                          blocks 0 .. num_blocks - 1: the scheduler's;  block num_blocks: PAD

A CUDA graph is captured for a fixed batch of B rows, and a step with n < B requests replays it
with B - n padding rows. Those rows must read and write *somewhere* harmless: their slot is in
the PAD block, their block-table row is all PAD and their K/V length is 1. The scheduler never
hands the PAD block out, so padding never touches a request's K/V.

The cache is the part the skeleton hands q, k, v to, so it owns where they go and which kernel
reads them:

    attend(layer, q, k, v, meta)      the torch ops' path: write (set_kv), then attend_cached
    rope_attend(attn, q, k, v, ...)   the fused ops' path: one kernel normalises q and k, rotates
                                      them and writes k, v into the cache (fused_rope.py); then
                                      attend_cached
    attend_cached(layer, q, meta)     stage 3's kernel, or the split-KV one for decode steps
    num_splits(batch, ...)            key splits of a decode step (host ints; the runner asks)
"""
from __future__ import annotations

import torch

from l3_paged.attention_ref import paged_attention_ref
from l3_paged.attention_triton import paged_attention_triton
from l3_paged.cache import IMPLS, set_kv_slots
from l3_paged.validate import check_paged_layout

from .attention_split import paged_attention_split, pick_num_splits
from .fused_rope import qk_norm_rope_write


def attend_paged(q, K, V, meta, block_table, impl: str):
    """One layer's attention over a model-dtype cache: the reference, stage 3's kernel, or split-KV."""
    args = (q, K, V, meta.cu_seqlens_q, meta.seq_lens_kv, block_table)
    if impl == "torch":
        return paged_attention_ref(*args)
    if meta.num_splits > 1:
        return paged_attention_split(*args, max_seqlen_q=meta.max_seqlen_q, num_splits=meta.num_splits,
                                     check=False, pdl=meta.pdl)
    return paged_attention_triton(*args, max_seqlen_q=meta.max_seqlen_q, check=False)


def norm_args(attn) -> dict:
    """The q/k-norm weights of a layer (Qwen3), for the fused write kernels; none for Llama and Qwen2."""
    norm = hasattr(attn, "q_norm")
    return dict(q_norm_weight=attn.q_norm.weight if norm else None, k_norm_weight=attn.k_norm.weight if norm else None,
                eps=attn.q_norm.eps if norm else 1e-6)


class FastKVCache:
    def __init__(self, cfg, num_blocks: int, block_size: int, device, dtype, impl: str = "triton"):
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        shape = (num_blocks + 1, block_size, cfg.num_kv_heads, cfg.head_dim)      # [N + PAD, B, H_kv, D]
        self.K = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.V = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.block_size, self.impl, self.num_blocks = block_size, impl, num_blocks
        self.pad_block = num_blocks                      # the last block: scratch for padding rows
        self.pad_slot = num_blocks * block_size
        self.bytes_per_block = 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.K + self.V)

    def num_splits(self, batch: int, max_kv_len: int, num_sms: int) -> int:
        """Key splits of a decode step of ``batch`` sequences (host ints). The cache decides: its
        attention kernel's tile sets how many programs an SM streams at once."""
        return pick_num_splits(batch, self.K[0].shape[2], max_kv_len, num_sms)          # K: [blocks, block, H_kv, D]

    def request_blocks(self, n_tokens: int, chunk: int) -> int:
        """The most blocks one request of ``n_tokens`` holds (the assembler sizes max_model_len by it)."""
        return -(-n_tokens // self.block_size)

    def check_layout(self, q, cu_seqlens_q, seq_lens_kv, block_table) -> None:
        """--check: the step's attention inputs against this cache's tensors."""
        check_paged_layout(q, self.K[0], self.V[0], cu_seqlens_q, seq_lens_kv, block_table)

    def set_kv(self, layer: int, slot_mapping, k, v) -> None:
        set_kv_slots(self.K[layer], self.V[layer], slot_mapping, k, v)

    def attend(self, layer: int, q, k, v, meta):                # the torch ops path (TorchOps)
        self.set_kv(layer, meta.slot_mapping, k, v)
        return self.attend_cached(layer, q, meta)

    def rope_attend(self, attn, q, k, v, cos, sin, meta, pdl: bool = False):   # the fused ops path (FusedOps)
        layer = attn.layer_idx
        q = qk_norm_rope_write(q, k, v, cos, sin, self.K[layer], self.V[layer], meta.slot_mapping, pdl=pdl,
                               **norm_args(attn))
        return self.attend_cached(layer, q, meta)

    def attend_cached(self, layer: int, q, meta):
        return attend_paged(q, self.K[layer], self.V[layer], meta, meta.block_table, self.impl)
