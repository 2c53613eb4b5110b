"""The prefix-caching KV manager: stage 5's scheduler, given this part, shares blocks by content.

Stage 5's scheduler talks to a KV manager (``l5_scheduler/kv_manager.py``). This one answers the
same calls over a block pool that remembers what each block holds (block_pool.py):

    admit(req, budget)    hashes = the request's full-block hash chain
                          hit    = longest_cached_prefix(hashes, ...)   capped: >= 1 token computed
                          take the hit blocks, then fresh ones for the first chunk, which starts
                          at num_computed_tokens = len(hit) * block_size instead of 0
    reserve(handle, n)    stage 2's call (returns at once while the last block has room)
    advance(scheduled)    cur_len += n; a block that just became full (and so written) is hashed
                          and cached: a prefill chunk's, or a decode's that filled its block
    free(handle)          one reference fewer per block, tail first; hashes stay on the blocks,
                          so a readmitted request usually finds its own blocks again

    prompt A (40 tokens) admitted, bs 16:   hit 0  -> computes 0..39, blocks 0 and 1 cached
    prompt B = A[:32] + 10 others:          hit 32 -> computes only 32..41

A block in ``hit`` may be free (reference count 0, still in the free queue). It must be taken
*before* any fresh block is allocated, or the allocation could evict the very block the request
is about to read. So ``allocate`` checks the whole need first, then touches, then allocates.

Handles are stage 2's ``Request`` (block list, the slot of every position the blocks hold,
``cur_len``), as in stage 5. A request's hash chain is computed once and extended as its blocks
fill; it is dropped with the handle, and recomputed if a preempted request comes back.
"""
from __future__ import annotations

from dataclasses import dataclass

from l2_gather.allocator import AllocatorError, OutOfBlocks, add_blocks, check_pool_shape

from .block_pool import BlockPool, KVCacheBlock
from .hashing import extend_chain, longest_cached_prefix


@dataclass
class CacheStats:
    """vLLM's prefix-cache hit rate counts tokens: of the tokens looked up, how many were found."""
    queries: int = 0            # tokens of requests admitted for the first time
    hits: int = 0               # ... of which found in the cache
    readmit_queries: int = 0    # tokens of preempted requests readmitted
    readmit_hits: int = 0

    def metrics(self) -> list[tuple]:
        """For ``LLM.get_metrics()``: (vLLM's name, kind, value, help)."""
        return [("vllm:prefix_cache_queries", "counter", self.queries, "prompt tokens looked up"),
                ("vllm:prefix_cache_hits", "counter", self.hits, "... of which found cached")]

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """``enable_caching`` (vLLM's ``enable_prefix_caching``) is the pool's property: off, nothing is
    hashed or looked up, and every block a request holds is its own."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        check_pool_shape(num_blocks, block_size)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.pool = BlockPool(num_blocks, enable_caching)
        self.stats = CacheStats()
        self.new_blocks: list = []                    # handles that gained blocks (stage 5's contract)
        self._num_cached: dict[object, int] = {}      # handle -> how many of its leading blocks are hashed
        self._hashes: dict[object, list[bytes]] = {}  # handle -> its request's full-block hash chain

    @property
    def num_free(self) -> int:
        """Blocks that may be handed out: never used, anonymous, or cached with no reference."""
        return self.pool.num_free

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def metrics(self) -> list[tuple]:
        return self.stats.metrics()

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    # ---- the scheduler's calls -------------------------------------------------------------------
    def admit(self, req, budget: int) -> int | None:
        """A waiting request's first chunk: its longest cached prefix, then blocks for up to
        ``budget`` more tokens. Returns the chunk's length, or None (nothing held)."""
        bs = self.block_size
        if self.pool.enable_caching:
            hashes = self.block_hashes(req, req.num_tokens // bs)  # every full block; the cap is the lookup's
            hit = [] if req.prompt_logits_owed else longest_cached_prefix(hashes, self.pool.cached,
                                                                                 req.num_tokens, bs)
        else:
            hit = []
        computed = len(hit) * bs
        n = min(req.num_tokens - computed, budget)
        try:
            self.allocate(req.kv, hit, computed + n)
        except OutOfBlocks:
            return None                                             # nothing taken, hits included
        if req.num_preemptions:
            self.stats.readmit_queries += req.num_tokens
            self.stats.readmit_hits += computed
        else:
            self.stats.queries += req.num_tokens
            self.stats.hits += computed
        return n

    def reserve(self, handle, n: int) -> None:
        """Grow ``handle`` to hold ``n`` tokens with fresh blocks (stage 2's contract)."""
        if handle.freed:
            raise AllocatorError(f"request {handle.req_id!r} was freed; make a new Request")
        if n <= len(handle.slot_indices):
            return                                                  # the last block has room
        need = self.blocks_for(n) - len(handle.blocks)
        if need > self.num_free:
            raise OutOfBlocks(f"request {handle.req_id!r} needs {need} more blocks for {n} tokens "
                              f"but only {self.num_free} of {self.num_blocks} are free")
        add_blocks(handle, [b.block_id for b in self.pool.allocate(need)], self.block_size)
        self.new_blocks.append(handle)

    def advance(self, scheduled) -> None:
        """The scheduled tokens' K/V are written: blocks that filled this step get their hashes."""
        bs, caching = self.block_size, self.pool.enable_caching
        for req, n in scheduled:
            kv = req.kv
            kv.cur_len += n
            if kv.cur_len % bs < n:                 # it crossed a block boundary: a block is now full
                if caching:
                    self.cache_full_blocks(kv, self.block_hashes(req, kv.cur_len // bs))

    def free(self, handle) -> None:
        """Drop one reference on each of ``handle``'s blocks, tail first. Checks, then mutates."""
        if handle.freed:
            raise AllocatorError(f"request {handle.req_id!r} freed twice")
        for b in handle.blocks:
            if not 0 <= b < self.num_blocks or self.pool.blocks[b].ref_cnt < 1:
                raise AllocatorError(f"request {handle.req_id!r} does not hold block {b}")
        self.pool.free([self.pool.blocks[b] for b in reversed(handle.blocks)])
        self._num_cached.pop(handle, None)
        self._hashes.pop(handle, None)
        handle.blocks, handle.slot_indices, handle.cur_len, handle.freed = [], [], 0, True

    # ---- the pieces --------------------------------------------------------------------------------
    def block_hashes(self, req, n_blocks: int) -> list[bytes]:
        """req's full-block hash chain, at least ``n_blocks`` long (computed once, extended as it grows)."""
        return extend_chain(self._hashes.setdefault(req.kv, []), req, n_blocks, self.block_size)

    def allocate(self, handle, hit: list[KVCacheBlock], n: int) -> None:
        """Give an empty ``handle`` the cached blocks ``hit`` and room for ``n`` tokens in all."""
        if handle.blocks or handle.cur_len:
            raise AllocatorError(f"request {handle.req_id!r} already holds blocks: admit starts from an empty handle")
        revived = sum(b.ref_cnt == 0 for b in hit)              # free now: they leave the queue
        need = self.blocks_for(n) - len(hit)
        if need + revived > self.num_free:
            raise OutOfBlocks(f"request {handle.req_id!r} needs {need} fresh blocks (+{revived} cached ones "
                              f"now free) for {n} tokens but only {self.num_free} are free")
        self.pool.touch(hit)                                     # before allocate: never evict a hit
        fresh = self.pool.allocate(need)
        handle.cur_len = len(hit) * self.block_size
        add_blocks(handle, [b.block_id for b in hit + fresh], self.block_size)
        self._num_cached[handle] = len(hit)
        self.new_blocks.append(handle)

    def num_cached_blocks(self, handle) -> int:
        """How many of ``handle``'s leading blocks have been through ``cache_full_blocks``."""
        return self._num_cached.get(handle, 0)

    def cache_full_blocks(self, handle, hashes: list[bytes]) -> None:
        """Hash every block of ``handle`` that its ``cur_len`` tokens fill (``hashes`` covers them)."""
        done = self._num_cached.get(handle, 0)
        full = handle.cur_len // self.block_size
        for i in range(done, full):
            self.pool.cache(self.pool.blocks[handle.blocks[i]], hashes[i])
        self._num_cached[handle] = max(done, full)
