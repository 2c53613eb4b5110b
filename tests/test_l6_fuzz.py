"""Property-based fuzz of the stage 6 scheduler (prefix caching on) with a fake model
(tests/l6_fake.py), no torch.

Hypothesis draws workloads whose prompts are cut from three shared "documents" plus a private
tail, so requests share system prompts, repeat each other, and are prefixes of each other; with
small pools they are also chunked, preempted and evicted. After every step the driver checks
(each test below is named after the invariant it protects, and fails on it alone):

    each block's ref_cnt equals the running requests holding it
    no block is free and held at once; free + held = total
    the hash map points only at blocks whose content has that hash
    new tokens are written only into private blocks
    attention reads the request's own tokens, at their positions
    at the end every count is 0 and every block is free or cached
    outputs equal the solo run, with the cache and however chunked or preempted

Tiers, as in tests/test_l5_fuzz.py: ``make test`` runs the all-invariants test (150 derandomized
examples) and every planted bug on its pinned, already-shrunk workload; ``make test-deep`` the
per-invariant tests and the searches from scratch, at the deep example count. The session
summary prints the figures.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from l5_fake import breaks, finds, only
from l6_fake import Workload, run
from l2_gather.allocator import add_blocks
from l5_scheduler.scheduler import Scheduler
from l6_prefix_cache import hashing, kv_manager


@st.composite
def workloads(draw, max_requests=10):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    num_blocks = draw(st.integers(1, 64))
    budget = draw(st.integers(1, 80))
    max_num_seqs = draw(st.integers(1, min(budget, 12)))
    reqs = draw(st.lists(st.tuples(st.sampled_from([0, 0, 0, 1, 2]), st.integers(0, 120), st.integers(0, 30),
                                   st.integers(1, 40), st.integers(0, 25)), min_size=1, max_size=max_requests))
    return Workload(block_size, num_blocks, budget, max_num_seqs, reqs)


def _only(invariant, w):
    only(invariant, run, w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l6_fuzz_ref_cnt_equals_the_running_requests_holding_each_block(w):
    _only("each block's ref_cnt equals the running requests holding it", w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l6_fuzz_no_block_is_free_and_held_at_once(w):
    _only("no block is free and held at once; free + held = total", w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l6_fuzz_the_hash_map_points_only_at_blocks_holding_that_content(w):
    _only("the hash map points only at blocks whose content has that hash", w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l6_fuzz_new_tokens_are_written_only_into_private_blocks(w):
    _only("new tokens are written only into private blocks", w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l6_fuzz_at_the_end_every_block_is_free_or_cached(w):
    _only("at the end every count is 0 and every block is free or cached", w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l6_fuzz_every_scheduled_request_computes_at_least_one_token(w):
    _only("every scheduled request computes at least one token (a full hit too)", w)


@pytest.mark.fuzz
@given(workloads())
def test_l6_fuzz_outputs_equal_solo_with_the_cache_however_chunked_or_preempted(w):
    run(w)   # every invariant at once


def test_l6_fuzz_workloads_really_share_chunk_preempt_and_evict():
    """The generator is not tame: a fixed sample hits the cache, preempts, and hits after preempting."""
    s1 = run(Workload(4, 20, 16, 4, [(0, 40, 3, 10, 0), (0, 40, 5, 8, 0), (0, 30, 0, 6, 2), (0, 40, 3, 10, 8)]))
    s2 = run(Workload(2, 12, 8, 3, [(0, 10, 3, 10, 0), (0, 10, 5, 8, 0), (0, 10, 0, 6, 2), (0, 12, 0, 5, 3)]))
    assert s1["hits"] > 0 and s2["hits"] > 0 and s2["preemptions"] > 0


# ---- every invariant can fail: planted cache bugs, each found by the same driver ---------------
# Every decision of the cache lives in the KV manager, so each bug is a manager with one thing wrong.
class NoTouchOnHit(kv_manager.KVCacheManager):          # a hit takes the blocks without a reference
    def allocate(self, handle, hit, n):
        self.pool.touch, real = (lambda blocks: None), self.pool.touch
        try:
            super().allocate(handle, hit, n)
        finally:
            self.pool.touch = real


class AllocateBeforeTouch(kv_manager.KVCacheManager):   # fresh blocks first: may evict the hit itself
    def allocate(self, handle, hit, n):
        fresh = self.pool.allocate(max(0, self.blocks_for(n) - len(hit)))
        self.pool.touch(hit)
        handle.cur_len = len(hit) * self.block_size
        add_blocks(handle, [b.block_id for b in hit + fresh], self.block_size)
        self._num_cached[handle] = len(hit)
        self.new_blocks.append(handle)


class EvictWithoutUnmap(kv_manager.KVCacheManager):     # an evicted block stays in the hash map
    def __init__(self, *a):
        super().__init__(*a)
        pool = self.pool

        def allocate(n):
            out = [pool.free_queue.popleft() for _ in range(n)]
            for b in out:
                b.ref_cnt, b.block_hash = 1, None      # forgets the hash, but not the map entry
            return out
        pool.allocate = allocate


class CachePartialBlocks(kv_manager.KVCacheManager):   # hashes a block whose K/V are not all written yet
    def advance(self, scheduled):                       # (its tokens are known: the rest of the prompt)
        super().advance(scheduled)
        bs = self.block_size
        for req, _ in scheduled:
            n = min(-(-req.num_computed_tokens // bs), len(req.prompt_ids) // bs)   # ceil: the partial one too
            for i, h in enumerate(self.block_hashes(req, n)[:n]):
                if self.pool.blocks[req.blocks[i]].block_hash is None:
                    self.pool.cache(self.pool.blocks[req.blocks[i]], h)


class FreeKeepsShared(kv_manager.KVCacheManager):       # a block another request shares is not released
    def free(self, handle):
        for b in handle.blocks:
            if self.pool.blocks[b].ref_cnt > 1:
                self.pool.blocks[b].ref_cnt += 1
        super().free(handle)


class NoHitCap(kv_manager.KVCacheManager):             # a full hit computes zero tokens (nano-vllm #144)
    def admit(self, req, budget):
        real = hashing.longest_cached_prefix
        kv_manager.longest_cached_prefix = lambda hs, cached, n, bs: real(self.block_hashes(req, n // bs), cached,
                                                                           n + 1, bs)
        try:
            return super().admit(req, budget)
        finally:
            kv_manager.longest_cached_prefix = real


class RecomputeLastTokenInPlace(kv_manager.KVCacheManager):   # the naive fix for a full hit: step back
    def admit(self, req, budget):                               # one token, into the shared block
        bs = self.block_size
        hashes = self.block_hashes(req, req.num_tokens // bs)
        hit = hashing.longest_cached_prefix(hashes, self.pool.cached, req.num_tokens + 1, bs)
        computed = min(len(hit) * bs, req.num_tokens - 1)
        n = min(req.num_tokens - computed, budget)
        try:
            self.allocate(req.kv, hit, computed + n)
        except kv_manager.OutOfBlocks:
            return None
        req.kv.cur_len = computed
        return n


BUGS = [
    (NoTouchOnHit, "each block's ref_cnt equals the running requests holding it"),
    (AllocateBeforeTouch, "no request holds a block twice"),
    (EvictWithoutUnmap, "the hash map points only at blocks whose content has that hash"),
    (CachePartialBlocks, "the hash map points only at blocks whose content has that hash"),
    (RecomputeLastTokenInPlace, "new tokens are written only into private blocks"),
    (FreeKeepsShared, "each block's ref_cnt equals the running requests holding it"),
    (NoHitCap, "every scheduled request computes at least one token (a full hit too)"),
]


# The workload each search below found (make test-deep), already shrunk: the pinned tests re-run it.
W = Workload
PINNED = {
    "NoTouchOnHit": W(block_size=1, num_blocks=3, budget=1, max_num_seqs=1,
                      requests=[(0, 0, 0, 1, 0), (0, 0, 0, 1, 0), (0, 1, 1, 1, 0)]),
    "AllocateBeforeTouch": W(block_size=8, num_blocks=4, budget=3, max_num_seqs=2,
                             requests=[(0, 0, 14, 6, 0), (0, 0, 7, 3, 0)]),
    "EvictWithoutUnmap": W(block_size=3, num_blocks=5, budget=1, max_num_seqs=1,
                           requests=[(0, 0, 0, 12, 0), (0, 0, 0, 4, 0)]),
    "CachePartialBlocks": W(block_size=2, num_blocks=2, budget=1, max_num_seqs=1, requests=[(0, 0, 2, 1, 0)]),
    "RecomputeLastTokenInPlace": W(block_size=1, num_blocks=2, budget=1, max_num_seqs=1,
                                   requests=[(0, 0, 0, 1, 0), (0, 0, 0, 1, 0)]),
    "FreeKeepsShared": W(block_size=1, num_blocks=3, budget=2, max_num_seqs=2,
                         requests=[(0, 0, 0, 1, 0), (0, 0, 0, 1, 0), (0, 1, 1, 1, 0), (0, 1, 1, 1, 0)]),
    "NoHitCap": W(block_size=1, num_blocks=2, budget=1, max_num_seqs=1, requests=[(0, 0, 0, 1, 0), (0, 0, 0, 1, 0)]),
}
IDS = lambda x: x.__name__ if isinstance(x, type) else ""   # noqa: E731


@pytest.mark.parametrize("bug,invariant", BUGS, ids=IDS)
def test_l6_pinned_workload_catches_a_planted_cache_bug(bug, invariant):
    """The real KV manager passes the pinned workload; the planted bug breaks exactly its invariant."""
    w = PINNED[bug.__name__]
    run(w)
    assert breaks(invariant, lambda w: run(w, Scheduler, 2000, bug), w)


@pytest.mark.deep
@pytest.mark.parametrize("bug,invariant", BUGS, ids=IDS)
def test_l6_fuzz_search_finds_a_planted_cache_bug(bug, invariant):
    assert finds(invariant, lambda w: run(w, Scheduler, 2000, bug), workloads(max_requests=6))
