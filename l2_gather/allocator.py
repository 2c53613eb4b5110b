"""A block allocator: KV memory handed out in fixed-size blocks, on demand, like pages.

    num_blocks blocks of block_size tokens; block b owns flat slots [b*block_size, (b+1)*block_size)

    request A: blocks [7, 2]      position i -> slot blocks[i // bs] * bs + i % bs
    bs = 4     slot_indices  = [28, 29, 30, 31, 8, 9, ...]

A request's blocks need not be contiguous or in order; only its *block list* is ordered.
Allocation and freeing are O(1) per block (a deque of free ids). A failed ``reserve`` hands out
nothing, so the allocator is never left half-way.

A block's slots come with it: ``slot_indices`` lists the slot of every position the request's
blocks can hold, written or not, so ``reserve(req, n)`` is free (one comparison, nothing
allocated) while ``n <= len(slot_indices)``: a decode needs the allocator once per block_size
tokens, not once per token.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from plumbing.exercise import learner_can_replace


class OutOfBlocks(RuntimeError):
    """No free block is left for a reservation. Nothing was allocated by the failed call."""


class AllocatorError(RuntimeError):
    """Misuse: freeing twice, or freeing a block the request does not own."""


@dataclass(eq=False)  # identity, not value, equality: two requests are never "the same"
class Request:
    req_id: object
    blocks: list[int] = field(default_factory=list)        # physical block ids, in logical order
    slot_indices: list[int] = field(default_factory=list)  # flat slot of each position its blocks hold
    cur_len: int = 0                                       # tokens whose K/V are in the pool
    freed: bool = False


@learner_can_replace  # lesson 2's build-it exercise: exercises/l2_gather.py
def slot_index(blocks: list[int], block_size: int, i: int) -> int:
    """Flat pool slot of logical position ``i``: its block's physical id times the block size,
    plus its offset inside the block (``blocks`` is the request's block list, in logical order)."""
    return blocks[i // block_size] * block_size + i % block_size


def add_blocks(req: Request, blocks: list[int], block_size: int) -> None:
    """Append ``blocks`` to ``req``'s block list, and the slots of every position they hold. A
    block's slots are consecutive, so ``slot_index`` is asked for the first slot of each block."""
    slots = req.slot_indices
    for b in blocks:
        req.blocks.append(b)
        first = slot_index(req.blocks, block_size, len(slots))
        slots += range(first, first + block_size)


def check_pool_shape(num_blocks: int, block_size: int) -> None:
    """Both sizes must be positive integers (any KV manager over a pool of blocks checks the same)."""
    for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        check_pool_shape(num_blocks, block_size)
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = deque(range(num_blocks))
        self._owner: list[Request | None] = [None] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)  # ceil

    def reserve(self, req: Request, n: int) -> None:
        """Grow ``req`` so it can hold ``n`` tokens (returns at once if its blocks already can)."""
        if req.freed:
            raise AllocatorError(f"request {req.req_id!r} was freed; make a new Request")
        if n <= len(req.slot_indices):
            return                                  # the last block has room
        need = self.blocks_for(n) - len(req.blocks)
        if need > len(self._free):
            raise OutOfBlocks(f"request {req.req_id!r} needs {need} more blocks for {n} tokens "
                              f"but only {len(self._free)} of {self.num_blocks} are free")
        fresh = [self._free.popleft() for _ in range(need)]
        for b in fresh:
            self._owner[b] = req
        add_blocks(req, fresh, self.block_size)

    def free(self, req: Request) -> None:
        """Return every block of ``req``. Checks first, then mutates: an error changes nothing."""
        if req.freed:
            raise AllocatorError(f"request {req.req_id!r} freed twice")
        for b in req.blocks:
            if not 0 <= b < self.num_blocks or self._owner[b] is not req:
                raise AllocatorError(f"request {req.req_id!r} does not own block {b}")
        for b in req.blocks:
            self._owner[b] = None
            self._free.append(b)
        req.blocks, req.slot_indices, req.cur_len, req.freed = [], [], 0, True
