"""Property-based fuzz of stage 8's KV manager (KV cache groups, windows, prefix caching) under stage
5's scheduler, with a fake windowed model (tests/l8_fake.py), no torch.

Workloads draw one to three groups (full or windowed), prompts cut from shared documents (so
prefixes hit), and small pools (so requests are chunked and preempted). After every step the
driver checks that a windowed group holds at most ceil((W + n - 1) / block_size) + 1 blocks, that
no freed block is read, that reference counts match the holders, and at the end that every
output equals the solo run. Tiers as in tests/test_l6_fuzz.py: ``make test`` runs every invariant
at once on derandomized examples and each planted bug on its pinned workload; ``make test-deep``
searches for each planted bug from scratch.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from l5_fake import breaks, finds
from l8_fake import Workload, run
from l8_sliding_window import group_managers, kv_coordinator
from l8_sliding_window.group_managers import FullAttentionManager, SlidingWindowManager


@st.composite
def workloads(draw, max_requests=8):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    windows = tuple(draw(st.lists(st.one_of(st.none(), st.integers(1, 40)), min_size=1, max_size=3)))
    budget = draw(st.integers(1, 48))
    reqs = draw(st.lists(st.tuples(st.sampled_from([0, 0, 1]), st.integers(0, 80), st.integers(0, 20),
                                   st.integers(1, 40), st.integers(0, 20)), min_size=1, max_size=max_requests))
    return Workload(block_size, draw(st.integers(4, 96)), budget, draw(st.integers(1, min(budget, 6))), reqs, windows)


@pytest.mark.fuzz
@given(workloads())
def test_l8_fuzz_windows_free_blocks_never_read_and_outputs_equal_solo(w):
    run(w)   # every invariant at once


def test_l8_fuzz_workloads_really_free_share_and_preempt():
    s = run(Workload(4, 24, 8, 3, [(0, 40, 3, 20, 0), (0, 40, 5, 12, 0), (0, 30, 0, 6, 2), (0, 40, 3, 10, 9)],
                     windows=(None, 6, 9)))
    assert s["freed"] > 0 and s["hits"] > 0 and s["preemptions"] > 0, s


# ---- every invariant can fail: planted bugs in the KV manager ----------------------------------
def windowed_with(cls):
    """The coordinator, with a planted ``cls`` as every windowed group's manager."""
    class Planted(kv_coordinator.KVCacheCoordinator):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.managers = [m if isinstance(m, FullAttentionManager) else
                             cls(m.pool, m.block_size, m.group, m.pad_block, m.window) for m in self.managers]
    Planted.__name__ = cls.__name__.lstrip("_")
    return Planted


class _FreesOneBlockTooMany(SlidingWindowManager):      # off by one: frees the block still in view
    def remove_skipped_blocks(self, h):
        self.window -= self.block_size
        try:
            return super().remove_skipped_blocks(h)
        finally:
            self.window += self.block_size


class _NeverFrees(SlidingWindowManager):                # the window is honoured, nothing freed
    def remove_skipped_blocks(self, h):
        return 0


class UntaggedHashes(kv_coordinator.KVCacheCoordinator):   # one hash for every group's block
    def admit(self, req, budget):
        return self._untagged(super().admit, req, budget)

    def advance(self, scheduled):
        return self._untagged(super().advance, scheduled)

    @staticmethod
    def _untagged(fn, *args):
        real = group_managers.tag
        group_managers.tag = lambda block_hash, g: block_hash
        try:
            return fn(*args)
        finally:
            group_managers.tag = real


FreesOneBlockTooMany, NeverFrees = windowed_with(_FreesOneBlockTooMany), windowed_with(_NeverFrees)
BUGS = [
    (FreesOneBlockTooMany, "no freed block is ever read: every block a step reads is held by the request"),
    (NeverFrees, "a windowed group holds at most ceil((W + n - 1) / block_size) + 1 blocks"),
    (UntaggedHashes, "outputs equal the solo run, with windows, however chunked, preempted or prefix-hit"),
]
W = Workload
PINNED = {
    "FreesOneBlockTooMany": W(2, 32, 8, 2, [(0, 20, 0, 10, 0)], windows=(5,)),
    "NeverFrees": W(2, 64, 8, 2, [(0, 20, 0, 10, 0)], windows=(5,)),
    "UntaggedHashes": W(4, 64, 16, 2, [(0, 40, 0, 4, 0), (0, 40, 2, 4, 30)], windows=(None, 8)),
}
IDS = lambda x: x.__name__ if isinstance(x, type) else ""   # noqa: E731


@pytest.mark.parametrize("bug,invariant", BUGS, ids=IDS)
def test_l8_pinned_workload_catches_a_planted_manager_bug(bug, invariant):
    w = PINNED[bug.__name__]
    run(w)
    assert breaks(invariant, lambda w: run(w, bug, 2000), w)


@pytest.mark.deep
@pytest.mark.parametrize("bug,invariant", BUGS, ids=IDS)
def test_l8_fuzz_search_finds_a_planted_manager_bug(bug, invariant):
    assert finds(invariant, lambda w: run(w, bug, 2000), workloads(max_requests=5))


def test_l8_dead_blocks_examples():
    """The window's freeing rule on the boundary cases (exercises/l8_sliding_window.py quotes them)."""
    from l8_sliding_window.group_managers import dead_blocks
    assert [dead_blocks(n, 20, 16) for n in (10, 19, 20, 34, 35, 50, 51, 53)] == [0, 0, 0, 0, 1, 1, 2, 2]
    assert [dead_blocks(n, 1, 1) for n in (0, 1, 2, 5)] == [0, 1, 2, 5]     # W = 1: only the query itself
    assert dead_blocks(4096, 4096, 16) == 0 and dead_blocks(4112, 4096, 16) == 1
