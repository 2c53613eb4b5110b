"""Stage 2: the block allocator's invariants, and gather attention on scattered blocks."""
import random

import pytest

from l1_dense.dense_kv import DenseEngine
from l1_dense.generate import greedy_generate
from l2_gather import allocator
from l2_gather.allocator import AllocatorError, BlockAllocator, OutOfBlocks, Request
from l2_gather.engine import GatherEngine
from l2_gather.pool import KVPool

PROMPTS = [[84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108], [72, 101, 108, 108, 111, 44, 32, 109, 121],
           [1, 2, 3]]


@pytest.mark.parametrize("block_size", [1, 5, 12, 16])
def test_slot_index_at_every_position(block_size):
    """``slot_index`` itself (a learner's, under ``LESSONS_LEARNER=l2``), asked for every position:
    the allocator asks only for each block's first slot, so an offset bug would not show there."""
    assert [allocator.slot_index([7, 2, 5], 4, i) for i in range(10)] == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21]
    blocks = random.Random(block_size).sample(range(50), 6)
    for i in range(len(blocks) * block_size):
        assert allocator.slot_index(blocks, block_size, i) == blocks[i // block_size] * block_size + i % block_size


@pytest.mark.parametrize("block_size", [1, 12, 16])
def test_slot_indices_follow_block_list(block_size):
    alloc = BlockAllocator(num_blocks=80, block_size=block_size)
    a, b = Request("a"), Request("b")
    for n in range(1, 40):           # grow both one token at a time, interleaved
        alloc.reserve(a, n)
        alloc.reserve(b, n)
    for req in (a, b):
        assert len(req.blocks) == -(-39 // block_size)
        for i, slot in enumerate(req.slot_indices):
            assert slot == req.blocks[i // block_size] * block_size + i % block_size


def test_out_of_blocks_allocates_nothing_and_allocator_stays_usable():
    alloc = BlockAllocator(num_blocks=4, block_size=4)
    a, b = Request("a"), Request("b")
    alloc.reserve(a, 10)                             # 3 blocks
    with pytest.raises(OutOfBlocks, match="needs 2 more blocks"):
        alloc.reserve(b, 8)                          # 2 blocks, 1 free
    assert b.blocks == [] and b.slot_indices == [] and alloc.num_free == 1
    alloc.reserve(b, 4)                              # the one free block still works
    alloc.free(a)
    alloc.free(b)
    assert alloc.num_free == 4


def test_double_free_and_foreign_block_are_errors_that_change_nothing():
    alloc = BlockAllocator(num_blocks=8, block_size=2)
    a, b = Request("a"), Request("b")
    alloc.reserve(a, 4)
    alloc.reserve(b, 4)
    stolen = Request("thief", blocks=[b.blocks[0]])
    with pytest.raises(AllocatorError, match="does not own block"):
        alloc.free(stolen)
    assert alloc.num_free == 4                       # nothing was returned
    alloc.free(a)
    with pytest.raises(AllocatorError, match="freed twice"):
        alloc.free(a)
    assert alloc.num_free == 6
    with pytest.raises(AllocatorError, match="was freed"):
        alloc.reserve(a, 1)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_block_size_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        BlockAllocator(num_blocks=4, block_size=bad)


def test_random_interleaved_reserve_free_never_shares_a_slot_and_never_leaks():
    rng = random.Random(1234)
    alloc = BlockAllocator(num_blocks=64, block_size=5)
    live: list[Request] = []
    for step in range(3000):
        op = rng.random()
        if op < 0.5 or not live:
            req = rng.choice(live) if live and rng.random() < 0.7 else Request(step)
            want = len(req.slot_indices) + rng.randint(1, 12)
            try:
                alloc.reserve(req, want)
                if req not in live:
                    live.append(req)
            except OutOfBlocks:
                pass
        else:
            alloc.free(live.pop(rng.randrange(len(live))))
        # invariants after every operation
        owned = [b for r in live for b in r.blocks]
        assert len(owned) == len(set(owned)), "a block is owned twice"
        assert len(owned) + alloc.num_free == alloc.num_blocks, "blocks leaked or duplicated"
        slots = [s for r in live for s in r.slot_indices]
        assert len(slots) == len(set(slots)), "a slot is handed out twice"
    for req in live:
        alloc.free(req)
    assert alloc.num_free == 64


@pytest.mark.parametrize("block_size", [1, 12, 16])
def test_l2_gather_tokens_match_l1_dense_with_scattered_blocks(tiny, block_size):
    """Two or three requests share one allocator and one pool and generate in lock-step, so each
    one's blocks are interleaved with the others' and (after a shuffle of the free list) out of order."""
    model, _ = tiny("qwen3")
    n_new = 12
    want = [greedy_generate(DenseEngine(model, 64), p, n_new).token_ids for p in PROMPTS]

    alloc = BlockAllocator(num_blocks=200 // block_size + 8, block_size=block_size)
    random.Random(0).shuffle(alloc._free)               # hand blocks out in a scrambled order
    p = next(model.parameters())
    pool = KVPool(model.cfg, alloc.num_blocks, block_size, p.device, p.dtype)
    engines = [GatherEngine(model, 0, block_size, allocator=alloc, pool=pool, req_id=i) for i in range(3)]
    got = [[] for _ in PROMPTS]
    logits = [e.prefill(p) for e, p in zip(engines, PROMPTS)]
    for _ in range(n_new):
        for i, e in enumerate(engines):
            tok = int(logits[i].argmax())
            got[i].append(tok)
            logits[i] = e.decode(tok)
    assert got == want
    for e in engines:
        blocks = e.req.blocks
        if len(blocks) > 1:
            assert blocks != sorted(blocks) or any(b - a != 1 for a, b in zip(blocks, blocks[1:]))
        e.release()
    assert alloc.num_free == alloc.num_blocks
