"""The scheduler's KV manager: where the scheduled tokens' K/V live.

The scheduler decides *who* runs each step and how many tokens each computes; its KV manager
decides *where* their K/V go. It is a part the scheduler is given (vLLM v1: the Scheduler and its
``KVCacheManager``). Stage 5's is stage 2's block allocator plus the calls a scheduler makes:

    admit(req, budget)    a waiting request's first chunk: blocks for min(num_tokens, budget)
                          tokens, all or nothing. Returns the chunk's length, or None (nothing
                          held) when the pool cannot take it. The chunk starts at the request's
                          num_computed_tokens, which admission sets (0 here).
    reserve(handle, n)    a running request's handle can hold n tokens (stage 2's call: returns at
                          once while its last block has room, OutOfBlocks when the pool is short)
    advance(scheduled)    after the forward pass: each request's scheduled tokens have their K/V
                          written (``cur_len += n``)
    free(handle)          preempted or finished: every block back (stage 2's call)
    new_blocks            the handles that gained blocks since the scheduler last took the list:
                          the scheduler hands it to the runner with the step (vLLM's
                          ``new_block_ids``), so a runner that keeps each request's block table
                          between steps sends only what changed

Another KV manager with the same calls (one that also finds blocks already computed by other
requests, say) can be given to the scheduler instead; it cannot tell them apart.
"""
from __future__ import annotations

from l2_gather.allocator import BlockAllocator, OutOfBlocks


class BlockManager(BlockAllocator):
    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.new_blocks: list = []

    def admit(self, req, budget: int) -> int | None:
        n = min(req.num_tokens, budget)
        try:
            self.reserve(req.kv, n)
        except OutOfBlocks:
            return None
        return n

    def reserve(self, handle, n: int) -> None:
        if n > len(handle.slot_indices):             # a new block: the runner must hear of it
            super().reserve(handle, n)
            self.new_blocks.append(handle)

    def advance(self, scheduled) -> None:
        for req, n in scheduled:
            req.kv.cur_len += n

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``LLM.reset_prefix_cache``, asked of the KV manager: this one remembers nothing."""
        return True

    def metrics(self) -> list[tuple]:
        """The KV manager's own counters for ``LLM.get_metrics()`` (name, kind, value, help): none here."""
        return []
