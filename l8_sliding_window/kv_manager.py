"""Stage 6's KV manager, per KV cache group, freeing what a windowed group no longer reads.

A request holds one block list per group (groups.py), all of one length: block i of every list
covers keys i*bs .. i*bs + bs - 1. The scheduler still sees one handle, ``req.kv``: group 0's. The
other groups' handles (stage 2 ``Request``s named ``(request_id, g)``) live here, grow and shrink
with it, and reach the runner through ``new_blocks`` like any handle that gained blocks.

After a step a request has ``cur_len`` tokens cached; its next query (position cur_len) sees keys
j > cur_len - W. In a group with window W every block whose last key is at or below cur_len - W
is never read again (vLLM's ``SlidingWindowManager.remove_skipped_blocks``):

    W = 20, block_size 16, cur_len 53:  keys 34..52 are visible next; block 0 (keys 0..15) and
                                        block 1 (16..31) are dead, blocks 2 and 3 are held
    handle.blocks  [7, 3, 9, 4]          unchanged: block i still means keys i*16..i*16+15
    skipped        2                     blocks 7 and 3 went back to the pool

A dead block gets one reference fewer, like a finished request's: its hash stays, so a later
request may still hit it until it is evicted. Its table entry stays (vLLM writes a null block
there); the kernels never load a key below the window (tests/test_l8_kernel.py fills those blocks
with NaN). So during a step computing n tokens a windowed group holds at most
ceil((W + n - 1) / block_size) + 1 blocks; a full group holds the whole history.

Prefix caching: each group caches its own blocks, under the block's hash tagged with the group.
A hit of k blocks needs, in a full group, all of blocks 0..k-1, and in a windowed group only the
blocks the first computed token sees (vLLM's hybrid lookup); the lower table entries of a
windowed group point at the PAD block and are counted as skipped from the start.
"""
from __future__ import annotations

from l2_gather.allocator import AllocatorError, OutOfBlocks, Request, add_blocks
from l6_prefix_cache.kv_manager import KVCacheManager
from plumbing.exercise import learner_can_replace


@learner_can_replace  # lesson 8's build-it exercise: exercises/l8_sliding_window.py
def dead_blocks(cur_len: int, window: int, block_size: int) -> int:
    """How many leading blocks no query at position >= cur_len reads with this window: the query at
    cur_len sees keys j > cur_len - window, so block i is dead once its last key
    (i + 1) * block_size - 1 is at or below cur_len - window."""
    return max(0, cur_len - window + 1) // block_size


def tag(block_hash: bytes, group: int) -> bytes:
    return block_hash if group == 0 else block_hash + bytes([group])


class SlidingWindowKVManager(KVCacheManager):
    def __init__(self, num_blocks: int, block_size: int, windows: list, *, caching: bool = True):
        """``windows``: per group, its window or None. ``caching=False``: no prefix lookups or hashes."""
        super().__init__(num_blocks, block_size)
        self.windows, self.caching = list(windows), caching
        self.pad_block = num_blocks                  # the cache's scratch block: entries never read
        self._handles: dict[object, list] = {}            # group 0's handle -> every group's handle
        self._skipped: dict[object, int] = {}             # any group's handle -> leading blocks freed
        self.blocks_freed = 0                        # by windows, over the manager's life

    # ---- what tests and the lesson read ---------------------------------------------------------
    def handles(self, handle) -> list:
        """The request's handle in every group (group 0's is ``req.kv`` itself)."""
        return self._handles.get(handle) or [handle]

    def skipped(self, handle, group: int = 0) -> int:
        return self._skipped.get(self.handles(handle)[group], 0)

    def held(self, handle, group: int = 0) -> int:
        """Blocks the request holds now in ``group`` (its table's length minus the freed ones)."""
        return len(self.handles(handle)[group].blocks) - self.skipped(handle, group)

    # ---- the scheduler's calls ------------------------------------------------------------------
    def admit(self, req, budget: int) -> int | None:
        bs, G = self.block_size, len(self.windows)
        hashes = self.block_hashes(req, req.num_tokens // bs) if self.caching else []
        k = self.hit_blocks(hashes, req.num_tokens)
        n = min(req.num_tokens - k * bs, budget)
        handles = [req.kv] + [Request((req.request_id, g)) for g in range(1, G)]
        try:
            self.allocate_groups(handles, hashes, k, k * bs + n)
        except OutOfBlocks:
            return None
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
        """K/V written: every group's cur_len grows; blocks that filled are cached (hashes first: a
        dead block is full and cached), then windowed groups free their dead blocks."""
        for req, n in scheduled:
            for g, h in enumerate(self.handles(req.kv)):
                h.cur_len += n
                if self.caching and h.cur_len % self.block_size < n:
                    self.cache_group(req, h, g)
                if self.windows[g] is not None:
                    self.remove_skipped_blocks(h, self.windows[g])

    def free(self, handle) -> None:
        """Every group's held blocks back, tail first (stage 6's order). Checks, then mutates."""
        if handle.freed:
            raise AllocatorError(f"request {handle.req_id!r} freed twice")
        hs = self.handles(handle)
        for h in hs:
            for b in h.blocks[self._skipped.get(h, 0):]:
                if not 0 <= b < self.num_blocks or self.pool.blocks[b].ref_cnt < 1:
                    raise AllocatorError(f"request {h.req_id!r} does not hold block {b}")
        for h in hs:
            held = h.blocks[self._skipped.pop(h, 0):]
            self.pool.free([self.pool.blocks[b] for b in reversed(held)])
            self._num_cached.pop(h, None)
            h.blocks, h.slot_indices, h.cur_len, h.freed = [], [], 0, True
        self._handles.pop(handle, None)
        self._hashes.pop(handle, None)

    # ---- the pieces ----------------------------------------------------------------------------------
    def first_needed(self, k: int, group: int) -> int:
        """The lowest block a query at position k * block_size reads in ``group``."""
        w = self.windows[group]
        return 0 if w is None else dead_blocks(k * self.block_size, w, self.block_size)

    def hit_blocks(self, hashes: list[bytes], num_tokens: int) -> int:
        """The longest hit every group can serve (at least one token left to compute)."""
        cached, k = self.pool.cached, min(len(hashes), (num_tokens - 1) // self.block_size)
        while k > 0:
            missing = [i for g in range(len(self.windows)) for i in range(self.first_needed(k, g), k)
                       if tag(hashes[i], g) not in cached]
            if not missing:
                return k
            k = min(k - 1, min(missing))             # a hit past a missing block is impossible
        return 0

    def allocate_groups(self, handles: list, hashes: list[bytes], k: int, n: int) -> None:
        """Every group's hit blocks (k, the ones it reads) and fresh blocks up to n tokens; all or nothing."""
        cached, pool = self.pool.cached, self.pool
        hits = [[cached[tag(hashes[i], g)] for i in range(self.first_needed(k, g), k)] for g in range(len(handles))]
        fresh = self.blocks_for(n) - k
        revived = len({b.block_id for hit in hits for b in hit if b.ref_cnt == 0})
        if fresh * len(handles) + revived > self.num_free:
            raise OutOfBlocks(f"request {handles[0].req_id!r} needs {fresh} fresh blocks in each of {len(handles)} "
                              f"groups (+{revived} cached ones now free) but only {self.num_free} are free")
        for hit in hits:
            pool.touch(hit)                          # all of them before allocate: never evict a hit
        for h, hit in zip(handles, hits):
            skip = k - len(hit)
            ids = [self.pad_block] * skip + [b.block_id for b in hit + pool.allocate(fresh)]
            h.cur_len = k * self.block_size
            add_blocks(h, ids, self.block_size)
            self._num_cached[h], self._skipped[h] = k, skip
            self.new_blocks.append(h)

    def cache_group(self, req, h, group: int) -> None:
        """Cache every block of group handle ``h`` that its cur_len tokens fill, under tagged hashes."""
        done, full = self._num_cached.get(h, 0), h.cur_len // self.block_size
        if full > done:
            hashes = self.block_hashes(req, full)
            for i in range(done, full):
                self.pool.cache(self.pool.blocks[h.blocks[i]], tag(hashes[i], group))
            self._num_cached[h] = full

    def remove_skipped_blocks(self, h, window: int) -> None:
        dead = dead_blocks(h.cur_len, window, self.block_size)      # blocks [0, dead) are dead
        done = self._skipped.get(h, 0)
        if dead > done:
            self.pool.free([self.pool.blocks[h.blocks[i]] for i in reversed(range(done, dead))])
            self._skipped[h] = dead
            self.blocks_freed += dead - done
