"""Stage 6's KV manager, which also frees the blocks that fall out of the window.

After a step, a request has ``cur_len`` tokens cached, and its next query (position cur_len) sees
keys j > cur_len - W. Every block whose last key is at or below cur_len - W is never read again,
by this request or by any later step of it (vLLM's ``SlidingWindowManager.remove_skipped_blocks``):

    W = 20, block_size 16, cur_len 53:  keys 34..52 are visible next; block 0 (keys 0..15) and
                                        block 1 (16..31) are dead, blocks 2 and 3 are held
    handle.blocks  [7, 3, 9, 4]          unchanged: block i still means keys i*16..i*16+15
    skipped        2                     blocks 7 and 3 went back to the pool

A dead block gets one reference fewer, like a finished request's (stage 6's pool: its hash stays,
so a later request with the same prefix may still hit it until it is evicted). Its table entry
stays as it was (vLLM writes a null block there): stage 7's runner keeps each request's table
row on the GPU and sends only appended blocks, and the kernel never loads a key below the window
(tests/test_l8_kernel.py fills those blocks with NaN and checks). A request then holds at most
ceil((W + n - 1) / block_size) + 1 blocks during a step that computes n tokens:
ceil(W / block_size) + 1 while it decodes.

Only a model whose *every* layer is windowed frees blocks: a full-attention layer reads every
key, and here all layers share one block table. Hybrid models keep their whole history (vLLM
gives each group of layers its own table; this stage does not yet). ``window`` is then None.
"""
from __future__ import annotations

from l6_prefix_cache.kv_manager import KVCacheManager


class SlidingWindowKVManager(KVCacheManager):
    def __init__(self, num_blocks: int, block_size: int, window: int | None):
        super().__init__(num_blocks, block_size)
        self.window = window
        self._skipped: dict[object, int] = {}        # handle -> how many leading blocks were freed
        self.blocks_freed = 0                        # by the window, over the manager's life

    def skipped(self, handle) -> int:
        """How many of ``handle``'s leading blocks the window has freed."""
        return self._skipped.get(handle, 0)

    def held(self, handle) -> int:
        """Blocks ``handle`` holds now (its table's length minus the freed ones)."""
        return len(handle.blocks) - self.skipped(handle)

    def advance(self, scheduled) -> None:
        super().advance(scheduled)                   # hashes first: a dead block is full and cached
        if self.window is not None:
            for req, _ in scheduled:
                self.remove_skipped_blocks(req.kv)

    def remove_skipped_blocks(self, handle) -> None:
        dead = max(0, handle.cur_len - self.window + 1) // self.block_size   # blocks [0, dead) are dead
        done = self.skipped(handle)
        if dead <= done:
            return
        pool = self.pool.blocks
        self.pool.free([pool[handle.blocks[i]] for i in reversed(range(done, dead))])
        self._skipped[handle] = dead
        self.blocks_freed += dead - done

    def free(self, handle) -> None:
        """Stage 6's free, over the blocks the handle still holds."""
        done = self._skipped.pop(handle, 0)
        if done and not handle.freed:
            handle.blocks = handle.blocks[done:]
        super().free(handle)
