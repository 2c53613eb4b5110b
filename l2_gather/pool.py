"""A token-flat KV pool and host-side gather attention.

Per layer, K and V are ``[num_slots, H_kv, D]`` with ``num_slots = num_blocks * block_size``:
the allocator's flat slot ids index them directly. Each step:

    set_kv:  K[layer][slot_mapping] = k            # scatter T new rows
    gather:  K_full = K[layer][kv_indices]          # [L, H_kv, D] copy of this sequence's history
    attend:  stage 1's contiguous attention over K_full, V_full

The gather is the slow, visible step: every layer of every step copies the whole history into a
fresh tensor (read L*H_kv*D elements, write L*H_kv*D elements, for K and again for V) before
attention reads it a third time. Reading the blocks where they lie would remove it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from l1_dense.dense_kv import attend_contiguous


@dataclass
class GatherMeta:
    positions: torch.Tensor       # [T] int64 RoPE positions
    slot_mapping: torch.Tensor    # [T] int64 flat slot of each new token
    kv_indices: torch.Tensor      # [L] int64 flat slots of positions 0..L-1 (new tokens included)
    logits_indices: torch.Tensor  # [1] int64: last row


class KVPool:
    def __init__(self, cfg, num_blocks: int, block_size: int, device, dtype):
        shape = self.layer_shape(num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.K = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.V = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.block_size = block_size
        self.bytes_per_block = 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * self.K[0].element_size()

    @staticmethod
    def layer_shape(num_blocks, block_size, h_kv, d) -> tuple:
        return (num_blocks * block_size, h_kv, d)                # [num_slots, H_kv, D]: token-flat

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.K + self.V)

    def set_kv(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.K[layer][slot_mapping] = k          # k [T, H_kv, D] scattered to T slots
        self.V[layer][slot_mapping] = v

    def attend(self, layer: int, q, k, v, meta: GatherMeta) -> torch.Tensor:
        self.set_kv(layer, meta.slot_mapping, k, v)
        k_full = self.K[layer][meta.kv_indices]  # gather: a fresh [L, H_kv, D] copy
        v_full = self.V[layer][meta.kv_indices]
        return attend_contiguous(q, k_full, v_full)  # [T, H_q, D]
