"""One sequence on the paged pool: the stage 2 harness that builds ``GatherMeta`` each step."""
from __future__ import annotations

import torch

from l1_dense.generate import Engine

from .allocator import BlockAllocator, Request
from .pool import GatherMeta, KVPool


class GatherEngine(Engine):
    def __init__(self, model, num_blocks: int, block_size: int, allocator: BlockAllocator | None = None,
                 pool: KVPool | None = None, req_id="seq0"):
        p = next(model.parameters())
        self.model, self.device = model, p.device
        self.alloc = allocator or BlockAllocator(num_blocks, block_size)
        self.pool = pool or KVPool(model.cfg, num_blocks, block_size, p.device, p.dtype)
        self.req = Request(req_id)

    def step(self, ids: list[int]) -> torch.Tensor:
        req, T = self.req, len(ids)
        start = req.cur_len
        self.alloc.reserve(req, start + T)                 # may take a new block; raises OutOfBlocks
        dev = self.device
        meta = GatherMeta(
            positions=torch.arange(start, start + T, device=dev),
            slot_mapping=torch.tensor(req.slot_indices[start:start + T], device=dev),
            kv_indices=torch.tensor(req.slot_indices[:start + T], device=dev),
            is_prefill=start == 0,
            logits_indices=torch.tensor([T - 1], device=dev),
        )
        logits = self.model(torch.tensor(ids, device=dev), self.pool, meta)
        req.cur_len = start + T
        return logits[0]

    def used_bytes(self) -> int:
        return len(self.req.blocks) * self.pool.bytes_per_block

    def release(self) -> None:
        self.alloc.free(self.req)
