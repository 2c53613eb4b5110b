"""One sequence on the paged pool: the stage 2 harness that builds ``GatherMeta`` each step."""
from __future__ import annotations

import torch

from l1_dense.generate import Engine

from .allocator import BlockAllocator, Request
from .pool import GatherMeta, KVPool


class GatherEngine(Engine):
    """Another layout of the pool swaps two things: the pool (``make_pool``) and the metadata
    (``make_meta``). Passing a shared ``allocator`` and ``pool`` lets several engines (requests)
    interleave their blocks, as the tests do."""

    def __init__(self, model, num_blocks: int, block_size: int, allocator: BlockAllocator | None = None,
                 pool=None, req_id="seq0"):
        p = next(model.parameters())
        self.model, self.device = model, p.device
        self.alloc = allocator or BlockAllocator(num_blocks, block_size)
        self.pool = pool or self.make_pool(model.cfg, num_blocks, block_size, p.device, p.dtype)
        self.req = Request(req_id)

    def make_pool(self, cfg, num_blocks, block_size, device, dtype):
        return KVPool(cfg, num_blocks, block_size, device, dtype)

    def make_meta(self, start: int, T: int) -> GatherMeta:
        slots, dev = self.req.slot_indices, self.device
        return GatherMeta(
            positions=torch.arange(start, start + T, device=dev),              # [T]
            slot_mapping=torch.tensor(slots[start:start + T], device=dev),     # [T]
            kv_indices=torch.tensor(slots[:start + T], device=dev),            # [start + T]
            logits_indices=torch.tensor([T - 1], device=dev),
        )

    def step(self, ids: list[int]) -> torch.Tensor:
        req, T = self.req, len(ids)
        start = req.cur_len
        self.alloc.reserve(req, start + T)                 # may take a new block; raises OutOfBlocks
        meta = self.make_meta(start, T)
        logits = self.model(torch.tensor(ids, device=self.device), self.pool, meta)  # [1, V]
        req.cur_len = start + T
        return logits[0]

    def used_bytes(self) -> int:
        return len(self.req.blocks) * self.pool.bytes_per_block

    def release(self) -> None:
        self.alloc.free(self.req)
