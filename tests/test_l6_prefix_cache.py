"""Stage 6's pieces on their own: the block hash chain, the free queue's eviction order, the pool's
reference counts and the manager's all-or-nothing admission. No model."""
import subprocess
import sys

import pytest

from l2_gather.allocator import OutOfBlocks
from l2_gather.allocator import Request as Handle
from l6_prefix_cache.block_pool import BlockPool
from l6_prefix_cache.hashing import ROOT, block_hashes, hash_block, longest_cached_prefix
from l6_prefix_cache.kv_manager import KVCacheManager


def test_l6_hash_is_stable_across_processes():
    """hashlib, not hash(): another interpreter (another PYTHONHASHSEED) gives the same bytes."""
    code = ("from l6_prefix_cache.hashing import block_hashes;"
            "print(block_hashes(list(range(40)), 16)[-1].hex())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": "", "PYTHONPATH": ":".join(sys.path)})
    assert other.stdout.strip() == block_hashes(list(range(40)), 16)[-1].hex()


def test_l6_hash_chains_the_parent_and_names_only_full_blocks():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(a) == 2                                            # the 9th token's block is partial
    b = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[1] != b[1], "block 1 has the same tokens but another prefix: its hash must differ"
    assert a[0] == hash_block(ROOT, [1, 2, 3, 4]) and a[1] == hash_block(a[0], [5, 6, 7, 8])
    assert hash_block(ROOT, [1, 2, 3, 4], extra=("salt",)) != a[0]
    assert hash_block(ROOT, [1, 2, 3, 4]) != hash_block(ROOT, [1, 2, 3, 5])


def test_l6_lookup_stops_at_the_first_miss_and_leaves_a_token_to_compute():
    hs = block_hashes(list(range(32)), 8)                          # 4 full blocks
    cached = {h: f"b{i}" for i, h in enumerate(hs)}
    assert longest_cached_prefix(hs, cached, 32, 8) == ["b0", "b1", "b2"]      # full hit: capped
    assert longest_cached_prefix(hs, cached, 33, 8) == ["b0", "b1", "b2", "b3"]
    del cached[hs[1]]
    assert longest_cached_prefix(hs, cached, 33, 8) == ["b0"]      # block 2 is useless without block 1
    assert longest_cached_prefix(hs, cached, 8, 8) == []           # one block of prompt: nothing to take


def test_l6_eviction_order_is_lru_and_a_requests_chain_tail_first():
    """The documented order: never-used blocks in id order, then freed blocks in the order they were
    freed, each request's blocks from the end of its chain to the start; a hit takes a free block
    out of the queue and a later free puts it at the tail again."""
    m = KVCacheManager(8, 4)
    a, b = Handle("a"), Handle("b")
    m.reserve(a, 12)                                               # a: blocks 0 1 2
    m.reserve(b, 8)                                                # b: blocks 3 4
    assert [x.block_id for x in m.pool.free_queue] == [5, 6, 7]
    m.free(b)
    m.free(a)
    assert [x.block_id for x in m.pool.free_queue] == [5, 6, 7, 4, 3, 2, 1, 0]
    c = Handle("c")
    hit = [m.pool.blocks[0], m.pool.blocks[1]]
    m.allocate(c, hit, 9)                                          # takes 0 and 1, one fresh block (5)
    assert c.blocks == [0, 1, 5] and c.cur_len == 8
    assert [x.block_id for x in m.pool.free_queue] == [6, 7, 4, 3, 2]
    m.free(c)
    assert [x.block_id for x in m.pool.free_queue] == [6, 7, 4, 3, 2, 5, 1, 0]


def test_l6_pool_keeps_hashes_of_free_blocks_until_eviction():
    pool = BlockPool(2)
    b0, b1 = pool.allocate(2)
    assert pool.cache(b0, b"h0") and pool.cache(b1, b"h1")
    assert not pool.cache(b0, b"h1"), "one block per hash"
    pool.free([b1, b0])
    assert pool.cached == {b"h0": b0, b"h1": b1} and pool.num_free == 2      # free *and* findable
    pool.touch([b0])
    assert b0.ref_cnt == 1 and pool.num_free == 1
    (again,) = pool.allocate(1)                                    # the only free one: b1, evicted
    assert again is b1 and b1.block_hash is None and b"h1" not in pool.cached and pool.evictions == 1


def test_l6_allocate_is_all_or_nothing():
    m = KVCacheManager(4, 4)
    a = Handle("a")
    m.reserve(a, 8)
    a.cur_len = 8                                                  # both blocks written
    m.cache_full_blocks(a, block_hashes(list(range(8)), 4))
    assert len(m.pool.cached) == 2
    m.free(a)                                                      # blocks 0, 1 free and cached
    big = Handle("big")
    with pytest.raises(OutOfBlocks):                               # 2 cached + 3 fresh > 4
        m.allocate(big, [m.pool.blocks[0], m.pool.blocks[1]], 20)
    assert big.blocks == [] and all(b.ref_cnt == 0 for b in m.pool.blocks) and m.num_free == 4
    assert len(m.pool.cached) == 2, "a failed admission evicted nothing"
