"""One KV cache group's block lists on the shared pool, by the kind of its layers (vLLM's
``SingleTypeKVCacheManager``): ``FullAttentionManager`` and ``SlidingWindowManager`` are siblings,
and the coordinator (kv_coordinator.py) holds one per group.

A request holds one handle per group (stage 2's block list), all of one length: block i of every
list covers keys i*bs .. i*bs + bs - 1. The two kinds differ in two answers:

    first_needed(k)          the lowest block a query at position k*bs reads: full 0, windowed
                             the first block the window reaches (``dead_blocks``)
    remove_skipped_blocks    after a step: nothing for full attention; a windowed group frees the
                             blocks below its window, which no query will read again

After a step a request has ``cur_len`` tokens cached; its next query (position cur_len) sees keys
j > cur_len - W. In a group with window W every block whose last key is at or below cur_len - W
is dead (vLLM's ``SlidingWindowManager.remove_skipped_blocks``):

    W = 20, block_size 16, cur_len 53:  keys 34..52 are visible next; block 0 (keys 0..15) and
                                        block 1 (16..31) are dead, blocks 2 and 3 are held
    handle.blocks  [7, 3, 9, 4]          unchanged: block i still means keys i*16..i*16+15
    skipped        2                     blocks 7 and 3 went back to the pool

A dead block gets one reference fewer, like a finished request's: its hash stays, so a later
request may still hit it until it is evicted. Its table entry stays (vLLM writes a null block
there); the kernels never load a key below the window (tests/test_l8_kernel.py fills those blocks
with NaN). Each group caches its blocks under the block's hash tagged with the group.
"""
from __future__ import annotations

from l2_gather.allocator import AllocatorError, add_blocks
from plumbing.exercise import learner_can_replace


@learner_can_replace  # lesson 8's build-it exercise: exercises/l8_sliding_window.py
def dead_blocks(cur_len: int, window: int, block_size: int) -> int:
    """How many leading blocks no query at position >= cur_len reads with this window: the query at
    cur_len sees keys j > cur_len - window, so block i is dead once its last key
    (i + 1) * block_size - 1 is at or below cur_len - window."""
    return max(0, cur_len - window + 1) // block_size


def tag(block_hash: bytes, group: int) -> bytes:
    return block_hash if group == 0 else block_hash + bytes([group])


class GroupManager:
    """What both kinds share: the hit blocks a group reads, taking, growing, caching, freeing."""

    def __init__(self, pool, block_size: int, group: int, pad_block: int):
        self.pool, self.block_size, self.group, self.pad_block = pool, block_size, group, pad_block
        self.skipped: dict[object, int] = {}         # handle -> leading blocks freed (or never taken)
        self.num_cached: dict[object, int] = {}      # handle -> leading blocks hashed

    def first_needed(self, k: int) -> int:
        raise NotImplementedError

    def remove_skipped_blocks(self, h) -> int:
        raise NotImplementedError

    def missing(self, hashes: list[bytes], k: int) -> list[int]:
        """The blocks a hit of k blocks needs in this group that the pool does not hold."""
        return [i for i in range(self.first_needed(k), k) if tag(hashes[i], self.group) not in self.pool.cached]

    def hit_blocks(self, hashes: list[bytes], k: int) -> list:
        return [self.pool.cached[tag(hashes[i], self.group)] for i in range(self.first_needed(k), k)]

    def take(self, h, hit: list, k: int, fresh: list) -> None:
        """An empty handle gets a hit of k blocks (the ones it reads; PAD below them) and fresh ones."""
        skip = k - len(hit)
        h.cur_len = k * self.block_size
        add_blocks(h, [self.pad_block] * skip + [b.block_id for b in hit + fresh], self.block_size)
        self.num_cached[h], self.skipped[h] = k, skip

    def cache(self, h, hashes: list[bytes]) -> None:
        """Cache every block of ``h`` that its cur_len tokens fill, under tagged hashes."""
        done, full = self.num_cached.get(h, 0), h.cur_len // self.block_size
        for i in range(done, full):
            self.pool.cache(self.pool.blocks[h.blocks[i]], tag(hashes[i], self.group))
        self.num_cached[h] = max(done, full)

    def check_held(self, h) -> None:
        for b in h.blocks[self.skipped.get(h, 0):]:
            if not 0 <= b < len(self.pool.blocks) or self.pool.blocks[b].ref_cnt < 1:
                raise AllocatorError(f"request {h.req_id!r} does not hold block {b}")

    def release(self, h) -> None:
        """Every block ``h`` still holds back to the pool, tail first (stage 6's order)."""
        held = h.blocks[self.skipped.pop(h, 0):]
        self.pool.free([self.pool.blocks[b] for b in reversed(held)])
        self.num_cached.pop(h, None)
        h.blocks, h.slot_indices, h.cur_len, h.freed = [], [], 0, True


class FullAttentionManager(GroupManager):
    def first_needed(self, k: int) -> int:
        return 0                                     # every key is read: a hit needs all its blocks

    def remove_skipped_blocks(self, h) -> int:
        return 0


class SlidingWindowManager(GroupManager):
    def __init__(self, pool, block_size: int, group: int, pad_block: int, window: int):
        super().__init__(pool, block_size, group, pad_block)
        self.window = window

    def first_needed(self, k: int) -> int:
        return dead_blocks(k * self.block_size, self.window, self.block_size)

    def remove_skipped_blocks(self, h) -> int:
        dead = dead_blocks(h.cur_len, self.window, self.block_size)      # blocks [0, dead) are dead
        done = self.skipped.get(h, 0)
        if dead <= done:
            return 0
        self.pool.free([self.pool.blocks[h.blocks[i]] for i in reversed(range(done, dead))])
        self.skipped[h] = dead
        return dead - done
