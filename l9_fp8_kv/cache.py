"""An fp8 KV cache: e4m3 codes with scales, for any KV cache groups (stage 8's, or one).

    K[layer], V[layer]              [num_blocks + 1, block_size, H_kv, D]  float8_e4m3fn (1 byte a value)
    k_scale[layer], v_scale[layer]  [num_blocks + 1, block_size, H_kv]     float32
        "fp8" (per tensor)          one value per layer (1.0: vLLM's default without calibrated scales),
                                    expanded: every stride 0, no memory
        "fp8_per_token_head"        its own storage: one scale per token and head, written with the codes

The tensors are shared between KV cache groups as in stage 8 (layer i of every group in tensor
i), the scale tensors with them; a checkpoint without windows is one group. Writes go through
the fused kernel (write.py: norm, RoPE and quantization in one) or, on the torch path, through
``set_kv`` and ``quantize_kv``; attention through stage 9's kernels (attention.py,
attention_split.py: any window, or none) or their reference.

A block of g layers holds 2 g block_size H_kv (D + s) bytes, s = 4 for per token-head scales and
0 for per-tensor ones: against bfloat16's 2 g block_size H_kv 2 D, 2x the blocks in the same
memory per tensor, 2D / (D + 4) (1.94x at D = 128) per token-head.
"""
from __future__ import annotations

import torch

from l3_paged.validate import check_paged_layout
from l7_fast.cache import norm_args
from l8_sliding_window.groups import KVGroup, group_of, group_size, layer_slots, layer_tensors, request_blocks

from .attention import check_fp8_cache, fp8_attention_ref, paged_attention_fp8
from .attention_split import fp8_num_splits, paged_attention_fp8_split
from .e4m3 import FP8, quantize_kv
from .write import rope_write_fp8


def bytes_per_block(cfg, groups: list[KVGroup], block_size: int, per_token: bool) -> int:
    """Bytes of one block of the shared pool (g layers' K and V codes, and their scales)."""
    return 2 * group_size(groups) * block_size * cfg.num_kv_heads * (cfg.head_dim + (4 if per_token else 0))


class Fp8KVCache:
    sliding_windows = True                           # stage 9's kernels take any window (or none)

    def __init__(self, cfg, groups: list[KVGroup], num_blocks: int, block_size: int, device, dtype,
                 impl: str = "triton", per_token: bool = False):
        """``num_blocks``: the pool's e4m3 blocks (``fp8_pool_blocks``); ``dtype``: the model's."""
        full = (num_blocks + 1, block_size, cfg.num_kv_heads, cfg.head_dim)      # [N + PAD, B, H_kv, D]
        self.groups, self.slots = groups, layer_slots(groups, cfg.num_layers)    # layer -> (group, tensor)
        self.K, self.V = layer_tensors(groups, cfg.num_layers, full, device, FP8)   # shared like stage 8's
        self.block_size, self.impl, self.num_blocks = block_size, impl, num_blocks
        self.pad_block, self.pad_slot = num_blocks, num_blocks * block_size
        self.model_dtype, self.per_token = dtype, per_token
        shape = full[:3]
        if per_token:                                                   # shared like K and V
            self.k_scale, self.v_scale = layer_tensors(groups, cfg.num_layers, shape, device, torch.float32, 1.0)
        else:
            one = [torch.ones(1, device=device, dtype=torch.float32).expand(shape) for _ in range(2 * cfg.num_layers)]
            self.k_scale, self.v_scale = one[::2], one[1::2]            # one value per layer, 0 strides
        self.bytes_per_block = bytes_per_block(cfg, groups, block_size, per_token)

    @property
    def nbytes(self) -> int:
        unique = {id(t): t for t in self.K + self.V + self.k_scale + self.v_scale}.values()
        return sum(t.untyped_storage().nbytes() for t in unique)

    def check_layout(self, q, cu_seqlens_q, seq_lens_kv, block_table) -> None:
        """--check: e4m3 codes and float32 scales, then stage 3's layout rules on a stand-in of q's
        dtype (one block converted, expanded to the cache's shape: no memory)."""
        check_fp8_cache(q, self.K[0], self.V[0], self.k_scale[0], self.v_scale[0])
        like_q = self.K[0][:1].to(q.dtype).expand(self.K[0].shape)
        check_paged_layout(q, like_q, like_q, cu_seqlens_q, seq_lens_kv, block_table)

    def num_splits(self, batch: int, max_kv_len: int, num_sms: int) -> int:
        """The e4m3 kernel's own split rule (attention_split.fp8_num_splits)."""
        return fp8_num_splits(batch, self.K[0].shape[2], max_kv_len, num_sms)

    def request_blocks(self, n_tokens: int, chunk: int) -> int:
        """The most blocks one request of ``n_tokens`` holds, in every group (stage 8's groups.py)."""
        return request_blocks(n_tokens, self.block_size, chunk, self.groups)

    def set_kv(self, layer: int, slot_mapping, k, v) -> None:
        """The torch path's write (TorchOps and the tests): quantize, then store codes and scales."""
        for cache, scales, x in ((self.K[layer], self.k_scale[layer], k), (self.V[layer], self.v_scale[layer], v)):
            _, _, h, d = cache.shape
            given = None if self.per_token else scales.reshape(-1, h)[slot_mapping]
            codes, s = quantize_kv(x, given)
            cache.view(-1, h, d)[slot_mapping] = codes
            if self.per_token:
                scales.view(-1, h)[slot_mapping] = s

    def attend(self, layer: int, q, k, v, meta):                    # the torch ops path (TorchOps)
        self.set_kv(layer, group_of(meta, self.slots[layer][0])[1], k, v)
        return self.attend_cached(layer, q, meta)

    def rope_attend(self, attn, q, k, v, cos, sin, meta, pdl: bool = False):   # the fused ops path
        """Norm, RoPE and e4m3 quantization in one write kernel (write.py; no PDL), then attention."""
        layer = attn.layer_idx
        q = rope_write_fp8(q, k, v, cos, sin, self.K[layer], self.V[layer], self.k_scale[layer], self.v_scale[layer],
                           group_of(meta, self.slots[layer][0])[1], per_token=self.per_token, **norm_args(attn))
        return self.attend_cached(layer, q, meta)

    def attend_cached(self, layer: int, q, meta):
        g = self.slots[layer][0]
        args = (q, self.K[layer], self.V[layer], self.k_scale[layer], self.v_scale[layer], meta.cu_seqlens_q,
                meta.seq_lens_kv, group_of(meta, g)[0])
        window = self.groups[g].window
        if self.impl == "torch":
            return fp8_attention_ref(*args, window=window)
        if meta.num_splits > 1:
            return paged_attention_fp8_split(*args, max_seqlen_q=meta.max_seqlen_q, num_splits=meta.num_splits,
                                             window=window, check=False)
        return paged_attention_fp8(*args, max_seqlen_q=meta.max_seqlen_q, window=window, check=False)


def fp8_pool_blocks(num_blocks: int, cfg, groups, block_size: int, model_dtype, per_token: bool) -> int:
    """Blocks of the e4m3 pool in the memory of ``num_blocks`` model-dtype blocks of the shared pool."""
    model = 2 * group_size(groups) * block_size * cfg.num_kv_heads * cfg.head_dim * model_dtype.itemsize
    return num_blocks * model // bytes_per_block(cfg, groups, block_size, per_token)

