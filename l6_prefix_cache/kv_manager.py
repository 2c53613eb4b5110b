"""The KV cache manager: stage 2's allocator interface over a block pool that remembers content.

Stage 5's scheduler calls ``reserve(handle, n)`` and ``free(handle)`` on its allocator; this
class answers the same calls (same ``OutOfBlocks``, same handle: stage 2's ``Request`` with its
block list, slot of every position and ``cur_len``), and adds the two calls of a prefix cache:

    admit(handle, hit, n)      a waiting request's first chunk: take the cached blocks ``hit``
                               (one reference each; cur_len jumps to len(hit) * block_size),
                               then fresh blocks up to n tokens. All or nothing.
    cache_full_blocks(handle, hashes)
                               after a forward pass: every block of the request that is now full
                               (and so written) gets its hash and becomes findable

A block in ``hit`` may be free (reference count 0, still in the free queue). It must be taken
*before* any fresh block is allocated, or the allocation could evict the very block the request
is about to read. So ``admit`` checks the whole need first, then touches, then allocates.
"""
from __future__ import annotations

from l2_gather.allocator import AllocatorError, OutOfBlocks, check_pool_shape, slot_index

from .block_pool import BlockPool, KVCacheBlock


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int):
        check_pool_shape(num_blocks, block_size)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.pool = BlockPool(num_blocks)
        self._num_cached: dict[object, int] = {}   # handle -> how many of its leading blocks are hashed

    @property
    def num_free(self) -> int:
        """Blocks that may be handed out: never used, anonymous, or cached with no reference."""
        return self.pool.num_free

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def _extend(self, handle, n: int, fresh: list[KVCacheBlock]) -> None:
        if fresh:
            handle.blocks += [b.block_id for b in fresh]
        for i in range(len(handle.slot_indices), n):
            handle.slot_indices.append(slot_index(handle.blocks, self.block_size, i))

    def reserve(self, handle, n: int) -> None:
        """Grow ``handle`` to hold ``n`` tokens with fresh blocks (stage 2's contract)."""
        if handle.freed:
            raise AllocatorError(f"request {handle.req_id!r} was freed; make a new Request")
        need = self.blocks_for(n) - len(handle.blocks)
        if need > self.num_free:
            raise OutOfBlocks(f"request {handle.req_id!r} needs {need} more blocks for {n} tokens "
                              f"but only {self.num_free} of {self.num_blocks} are free")
        self._extend(handle, n, self.pool.allocate(need) if need > 0 else ())

    def admit(self, handle, hit: list[KVCacheBlock], n: int) -> None:
        """Give an empty ``handle`` the cached blocks ``hit`` and room for ``n`` tokens in all."""
        if handle.blocks or handle.cur_len:
            raise AllocatorError(f"request {handle.req_id!r} already holds blocks: admit starts from an empty handle")
        revived = sum(b.ref_cnt == 0 for b in hit)              # free now: they leave the queue
        need = self.blocks_for(n) - len(hit)
        if need + revived > self.num_free:
            raise OutOfBlocks(f"request {handle.req_id!r} needs {need} fresh blocks (+{revived} cached ones "
                              f"now free) for {n} tokens but only {self.num_free} are free")
        self.pool.touch(hit)                                     # before allocate: never evict a hit
        handle.cur_len = len(hit) * self.block_size
        self._extend(handle, handle.cur_len, hit)
        self._num_cached[handle] = len(hit)
        self.reserve(handle, n)

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

    def free(self, handle) -> None:
        """Drop one reference on each of ``handle``'s blocks, tail first. Checks, then mutates."""
        if handle.freed:
            raise AllocatorError(f"request {handle.req_id!r} freed twice")
        for b in handle.blocks:
            if not 0 <= b < self.num_blocks or self.pool.blocks[b].ref_cnt < 1:
                raise AllocatorError(f"request {handle.req_id!r} does not hold block {b}")
        self.pool.free([self.pool.blocks[b] for b in reversed(handle.blocks)])
        self._num_cached.pop(handle, None)
        handle.blocks, handle.slot_indices, handle.cur_len, handle.freed = [], [], 0, True
