"""Stage 5's scheduler with a prefix cache: admission looks up the longest cached prefix first.

Everything else is stage 5's (one budget, chunked prefill, preemption by recompute). Three
places change:

    admit      hashes = the request's full-block hash chain (kept across preemptions)
               hit    = longest_cached_prefix(hashes, ...)      capped: >= 1 token computed
               take the hit blocks, reserve fresh ones for the first chunk, which starts at
               num_computed_tokens = len(hit) * block_size instead of 0
    advance    after the forward pass, blocks that became full are hashed and cached
               (a prefill chunk's, or a decode's that filled its block)
    preempt /  the blocks lose a reference, keep their hashes, and wait in the free queue; a
    finish     readmitted request usually finds its own blocks again

    prompt A (40 tokens) admitted, bs 16:   hit 0  -> computes 0..39, blocks 0 and 1 cached
    prompt B = A[:32] + 10 others:          hit 32 -> computes only 32..41
"""
from __future__ import annotations

from dataclasses import dataclass

from l5_scheduler.request import Request
from l5_scheduler.scheduler import Scheduler, SchedulerOutput
from l2_gather.allocator import OutOfBlocks

from .hashing import ROOT, hash_block, longest_cached_prefix
from .kv_manager import KVCacheManager


@dataclass
class CacheStats:
    """vLLM's prefix-cache hit rate counts tokens: of the tokens looked up, how many were found."""
    queries: int = 0            # tokens of requests admitted for the first time
    hits: int = 0               # ... of which found in the cache
    readmit_queries: int = 0    # tokens of preempted requests readmitted
    readmit_hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class PrefixCachingScheduler(Scheduler):
    allocator_cls = KVCacheManager                                # same interface as stage 2's allocator

    def __init__(self, num_blocks: int, block_size: int, max_num_batched_tokens: int, max_num_seqs: int):
        super().__init__(num_blocks, block_size, max_num_batched_tokens, max_num_seqs)
        self.hashes: dict[Request, list[bytes]] = {}               # request -> its full blocks' hash chain
        self.hits: dict[str, int] = {}                             # this step's admissions: id -> cached tokens
        self.stats = CacheStats()

    def block_hashes(self, req: Request, n_blocks: int) -> list[bytes]:
        """req's full-block hash chain, at least ``n_blocks`` long (computed once, extended as it grows)."""
        hs = self.hashes.setdefault(req, [])
        bs = self.alloc.block_size
        while len(hs) < n_blocks:
            i = len(hs)
            hs.append(hash_block(hs[-1] if hs else ROOT, req.tokens(i * bs, bs)))
        return hs

    def schedule(self) -> SchedulerOutput:
        self.hits = {}
        return super().schedule()

    def _admit_blocks(self, req: Request, budget: int) -> int | None:
        bs = self.alloc.block_size
        hashes = self.block_hashes(req, req.num_tokens // bs)       # every full block; the cap is the lookup's
        hit = longest_cached_prefix(hashes, self.alloc.pool.cached, req.num_tokens, bs)
        computed = len(hit) * bs
        n = min(req.num_tokens - computed, budget)
        try:
            self.alloc.admit(req.kv, hit, computed + n)
        except OutOfBlocks:
            return None                                            # nothing taken, hits included
        self.hits[req.request_id] = computed
        if req.num_preemptions:
            self.stats.readmit_queries += req.num_tokens
            self.stats.readmit_hits += computed
        else:
            self.stats.queries += req.num_tokens
            self.stats.hits += computed
        return n

    def advance(self, out: SchedulerOutput) -> None:
        super().advance(out)
        bs = self.alloc.block_size
        for req, _ in out.scheduled:
            full = req.num_computed_tokens // bs
            if full > self.alloc.num_cached_blocks(req.kv):      # a decode fills a block 1 step in block_size
                self.alloc.cache_full_blocks(req.kv, self.block_hashes(req, full))

    def finish(self, req: Request, finish_reason: str, stop_reason=None) -> None:
        super().finish(req, finish_reason, stop_reason)
        self.hashes.pop(req, None)
