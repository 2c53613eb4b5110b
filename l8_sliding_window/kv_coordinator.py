"""The scheduler's KV manager for a windowed checkpoint: one manager per KV cache group, one
shared pool (vLLM's ``KVCacheCoordinator``).

Stage 5's scheduler sees one handle per request, ``req.kv``: group 0's. The other groups' handles
(stage 2 ``Request``s named ``(request_id, g)``) live here, grow and shrink with it, and reach the
runner through ``new_blocks`` like any handle that gained blocks. Each group's manager is picked
by its group's spec (group_managers.py): full attention, or a sliding window, which frees the
blocks its layers no longer read.

    admit(req, budget)    the longest prefix hit every group can serve (a full group needs all of
                          blocks 0..k-1, a windowed one only those its first computed token sees:
                          vLLM's hybrid lookup), then fresh blocks for the first chunk, in every
                          group, all or nothing
    reserve(handle, n)    every group's handle grows to n tokens
    advance(scheduled)    cur_len += n in every group; blocks that filled are cached (hashes first:
                          a dead block is full and cached); windowed groups free their dead blocks
    free(handle)          every group's held blocks back, tail first

Prefix caching is the pool's property (``enable_caching``, stage 6): off, nothing is hashed or
looked up, and the windowed groups still free what falls out of their window.
"""
from __future__ import annotations

from l2_gather.allocator import AllocatorError, OutOfBlocks, Request, add_blocks, check_pool_shape
from l6_prefix_cache.block_pool import BlockPool
from l6_prefix_cache.hashing import extend_chain
from l6_prefix_cache.kv_manager import CacheStats

from .group_managers import FullAttentionManager, SlidingWindowManager


class KVCacheCoordinator:
    def __init__(self, num_blocks: int, block_size: int, windows: list, *, enable_caching: bool = True):
        """``windows``: per group, its window or None (full attention)."""
        check_pool_shape(num_blocks, block_size)
        self.num_blocks, self.block_size, self.windows = num_blocks, block_size, list(windows)
        self.pool = BlockPool(num_blocks, enable_caching)
        pad = num_blocks                             # the cache's scratch block: entries never read
        self.managers = [FullAttentionManager(self.pool, block_size, g, pad) if w is None else
                         SlidingWindowManager(self.pool, block_size, g, pad, w) for g, w in enumerate(windows)]
        self.stats = CacheStats()
        self.new_blocks: list = []                   # handles that gained blocks (stage 5's contract)
        self._handles: dict[object, list] = {}       # group 0's handle -> every group's handle
        self._hashes: dict[object, list] = {}        # group 0's handle -> its request's hash chain
        self.blocks_freed = 0                        # by windows, over the coordinator's life

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def metrics(self) -> list[tuple]:
        """No prefix-cache hit counters here yet (stage 6's manager counts them): none reported."""
        return []

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    # ---- what tests and the lesson read ---------------------------------------------------------
    def handles(self, handle) -> list:
        """The request's handle in every group (group 0's is ``req.kv`` itself)."""
        return self._handles.get(handle) or [handle]

    def skipped(self, handle, group: int = 0) -> int:
        return self.managers[group].skipped.get(self.handles(handle)[group], 0)

    def held(self, handle, group: int = 0) -> int:
        """Blocks the request holds now in ``group`` (its table's length minus the freed ones)."""
        return len(self.handles(handle)[group].blocks) - self.skipped(handle, group)

    # ---- the scheduler's calls ------------------------------------------------------------------
    def admit(self, req, budget: int) -> int | None:
        bs = self.block_size
        hashes = self.block_hashes(req, req.num_tokens // bs) if self.pool.enable_caching else []
        k = 0 if req.prompt_logits_owed else self.hit_length(hashes, req.num_tokens)   # prompt logprobs
        n = min(req.num_tokens - k * bs, budget)
        handles = [req.kv] + [Request((req.request_id, g)) for g in range(1, len(self.managers))]
        hits = [m.hit_blocks(hashes, k) for m in self.managers]
        fresh = self.blocks_for(k * bs + n) - k
        revived = len({b.block_id for hit in hits for b in hit if b.ref_cnt == 0})
        if fresh * len(handles) + revived > self.num_free:
            return None                              # nothing taken, hits included
        for hit in hits:
            self.pool.touch(hit)                     # all of them before allocate: never evict a hit
        for m, h, hit in zip(self.managers, handles, hits):
            m.take(h, hit, k, self.pool.allocate(fresh))
            self.new_blocks.append(h)
        self._handles[req.kv] = handles
        if req.num_preemptions:
            self.stats.readmit_queries += req.num_tokens
            self.stats.readmit_hits += k * bs
        else:
            self.stats.queries += req.num_tokens
            self.stats.hits += k * bs
        return n

    def reserve(self, handle, n: int) -> None:
        if handle.freed:
            raise AllocatorError(f"request {handle.req_id!r} was freed; make a new Request")
        if n <= len(handle.slot_indices):
            return
        hs = self.handles(handle)
        per = self.blocks_for(n) - len(handle.blocks)
        if per * len(hs) > self.num_free:
            raise OutOfBlocks(f"request {handle.req_id!r} needs {per} more blocks in each of {len(hs)} groups "
                              f"for {n} tokens but only {self.num_free} of {self.num_blocks} are free")
        for h in hs:
            add_blocks(h, [b.block_id for b in self.pool.allocate(per)], self.block_size)
            self.new_blocks.append(h)

    def advance(self, scheduled) -> None:
        for req, n in scheduled:
            for m, h in zip(self.managers, self.handles(req.kv)):
                h.cur_len += n
                if self.pool.enable_caching and h.cur_len % self.block_size < n:   # a block filled
                    m.cache(h, self.block_hashes(req, h.cur_len // self.block_size))
                self.blocks_freed += m.remove_skipped_blocks(h)

    def free(self, handle) -> None:
        """Every group's held blocks back. Checks, then mutates."""
        if handle.freed:
            raise AllocatorError(f"request {handle.req_id!r} freed twice")
        hs = self.handles(handle)
        for m, h in zip(self.managers, hs):
            m.check_held(h)
        for m, h in zip(self.managers, hs):
            m.release(h)
        self._handles.pop(handle, None)
        self._hashes.pop(handle, None)

    # ---- the pieces ----------------------------------------------------------------------------------
    def block_hashes(self, req, n_blocks: int) -> list[bytes]:
        return extend_chain(self._hashes.setdefault(req.kv, []), req, n_blocks, self.block_size)

    def hit_length(self, hashes: list[bytes], num_tokens: int) -> int:
        """The longest hit, in blocks, every group can serve (at least one token left to compute)."""
        k = min(len(hashes), (num_tokens - 1) // self.block_size)
        while k > 0:
            missing = [i for m in self.managers for i in m.missing(hashes, k)]
            if not missing:
                return k
            k = min(k - 1, min(missing))             # a hit past a missing block is impossible
        return 0
