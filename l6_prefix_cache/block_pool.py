"""The block pool: every KV block with a reference count, a free queue in eviction order, and a
hash -> block map of the blocks whose content is known.

    block state          ref_cnt   in free queue   block_hash   reusable by a lookup?
    held, private          >= 1        no             None          no
    held, cached           >= 1        no             h             yes (shared: ref_cnt += 1)
    free, cached             0         yes            h             yes (taken off the queue)
    free, anonymous          0         yes            None          no

A block whose count drops to 0 keeps its hash and its K/V: it is free (it may be handed out)
*and* cached (a lookup may still find it) until ``allocate`` evicts it, which drops it from the
map before anyone writes to it.

The free queue is least recently used first. ``free`` is given a request's blocks tail first
(vLLM orders them this way), so among the blocks one request frees, the end of its hash chain is
evicted before the start: a later request that shares only the beginning still finds it.

    free queue (head = next evicted):  [ 7  3  9 | A2 A1 A0 | B1 B0 ]
                                        never     A finished B finished
                                        used      first      later

The queue is a doubly linked list through the blocks themselves (vLLM's
``FreeKVCacheBlockQueue``) with two sentinel nodes, so taking a cached block out of the middle on
a hit is O(1), as are popping the head and appending at the tail.
"""
from __future__ import annotations


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev", "next")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None          # set once the block is full and written
        self.prev: KVCacheBlock | None = None          # free-queue links (None: not in the queue)
        self.next: KVCacheBlock | None = None

    def __repr__(self):
        h = self.block_hash.hex()[:6] if self.block_hash else "-"
        return f"Block({self.block_id}, ref={self.ref_cnt}, hash={h})"


class FreeKVCacheBlockQueue:
    """Doubly linked free list: popleft (evict), remove (hit on a free block), append (freed)."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self.head, self.tail = KVCacheBlock(-1), KVCacheBlock(-1)   # sentinels
        self.head.next, self.tail.prev = self.tail, self.head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def append(self, b: KVCacheBlock) -> None:
        last = self.tail.prev
        last.next, b.prev, b.next, self.tail.prev = b, last, self.tail, b
        self.num_free += 1

    def remove(self, b: KVCacheBlock) -> None:
        b.prev.next, b.next.prev = b.next, b.prev
        b.prev = b.next = None
        self.num_free -= 1

    def popleft(self) -> KVCacheBlock:
        b = self.head.next
        if b is self.tail:
            raise IndexError("the free queue is empty")
        self.remove(b)
        return b

    def __iter__(self):                                   # head to tail: eviction order
        b = self.head.next
        while b is not self.tail:
            yield b
            b = b.next


class BlockPool:
    """``enable_caching=False``: the same pool that names nothing (no hashes, no hits: stage 5's
    behaviour, with this pool's order of handing out blocks)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeKVCacheBlockQueue(self.blocks)     # 0, 1, 2, ... first
        self.cached: dict[bytes, KVCacheBlock] = {}              # hash -> the one block holding it
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return self.free_queue.num_free

    def allocate(self, n: int) -> list[KVCacheBlock]:
        """``n`` blocks off the head of the free queue, each evicted from the map first."""
        if n > self.num_free:
            raise ValueError(f"asked for {n} blocks, {self.num_free} free")   # callers check first
        out = [self.free_queue.popleft() for _ in range(n)]
        for b in out:
            if b.block_hash is not None:                       # evict: forget what it held
                del self.cached[b.block_hash]
                b.block_hash = None
                self.evictions += 1
            b.ref_cnt = 1
        return out

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """One more reference each (a prefix hit); a free block leaves the queue."""
        for b in blocks:
            if b.ref_cnt == 0:
                self.free_queue.remove(b)
            b.ref_cnt += 1

    def free(self, blocks_tail_first: list[KVCacheBlock]) -> None:
        """One reference fewer each; a block reaching 0 goes to the queue's tail, hash kept."""
        for b in blocks_tail_first:
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free_queue.append(b)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block's content (vLLM's ``reset_prefix_cache``), only when no block is held:
        returns False, changing nothing, while one is."""
        if any(b.ref_cnt for b in self.blocks):
            return False
        for b in self.blocks:
            b.block_hash = None
        self.cached.clear()
        return True

    def cache(self, b: KVCacheBlock, block_hash: bytes) -> bool:
        """Name a full, written block by its hash. If another block already holds that hash (two
        requests computed the same prefix in the same step), this one stays anonymous: one block
        per hash, and the duplicate is reused as a plain free block once its owner lets go."""
        if block_hash in self.cached or not self.enable_caching:
            return False
        b.block_hash = block_hash
        self.cached[block_hash] = b
        return True
