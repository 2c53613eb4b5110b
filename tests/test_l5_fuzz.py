"""Property-based fuzz of the stage 5 scheduler with a fake model (tests/l5_fake.py), no torch.

Hypothesis draws workloads: prompt and output lengths, arrival steps, token budget,
max_num_seqs, num_blocks and block_size. After every step the driver checks the invariants
(each test below is named after the one it protects, and fails on it alone):

    no block is owned twice; free + owned = total
    each step stays within the token budget and max_num_seqs
    every scheduled request has blocks for all its tokens
    every request finishes; at the end the pool is entirely free
    outputs equal the solo run, however the request was chunked or preempted

Tiers. ``make test`` runs the all-invariants test at the default example count (150, derandomized:
the same examples on every machine) and every planted bug on the workload a search once found for
it (pinned below, already shrunk: milliseconds). ``make test-deep`` runs the per-invariant tests
and the searches themselves from scratch, at the deep example count:
    python -m pytest tests/test_l5_fuzz.py -m "deep or fuzz" --hypothesis-profile=deep
The session summary prints how many workloads, steps and invariant checks ran.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from l5_fake import Workload, breaks, finds, only, run
from l5_scheduler.request import KVBlocks
from l5_scheduler.scheduler import Scheduler

# The profiles (ci, the default, and deep) are registered in conftest.py: hypothesis reads
# --hypothesis-profile before this module is imported.


@st.composite
def workloads(draw, max_requests=10):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    num_blocks = draw(st.integers(1, 48))
    budget = draw(st.integers(1, 80))
    max_num_seqs = draw(st.integers(1, min(budget, 12)))
    reqs = draw(st.lists(st.tuples(st.integers(1, 120), st.integers(1, 40), st.integers(0, 25)),
                         min_size=1, max_size=max_requests))
    return Workload(block_size, num_blocks, budget, max_num_seqs, reqs, seed=draw(st.integers(0, 9)))


def _only(invariant, w):
    only(invariant, run, w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l5_fuzz_no_block_is_owned_twice(w):
    _only("no block is owned twice", w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l5_fuzz_free_plus_owned_equals_total(w):
    _only("free + owned = total", w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l5_fuzz_each_step_stays_within_budget_and_max_num_seqs(w):
    _only("each step stays within the token budget", w)
    _only("each step stays within max_num_seqs", w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l5_fuzz_every_scheduled_request_has_blocks_for_all_its_tokens(w):
    _only("every scheduled request has blocks for all its tokens", w)


@pytest.mark.deep
@pytest.mark.fuzz
@given(workloads())
def test_l5_fuzz_every_request_finishes_and_the_pool_ends_free(w):
    _only("every request finishes (progress every step)", w)
    _only("at the end the pool is entirely free", w)


@pytest.mark.fuzz
@given(workloads())
def test_l5_fuzz_outputs_equal_solo_however_chunked_or_preempted(w):
    run(w)   # every invariant at once; the ones above fail first and name the culprit


def test_l5_fuzz_workloads_really_chunk_and_preempt():
    """The generator is not tame: across a fixed sample, prefills get chunked and requests preempted."""
    chunked = preempted = 0
    for w in (Workload(4, 10, 8, 4, [(30, 10, 0), (25, 12, 0), (5, 20, 1), (12, 6, 3)]),
              Workload(1, 40, 16, 3, [(20, 15, 0), (18, 10, 0), (1, 9, 2)])):
        stats = run(w)
        preempted += stats["preemptions"]
        chunked += stats["steps"] > 0
    assert preempted > 0 and chunked == 2


# ---- every invariant can fail: planted scheduler bugs, each found by the same driver ----------
class LeakOnFinish(Scheduler):          # forgets to free a finished request's blocks
    def finish(self, req, finish_reason, stop_reason=None):
        self.running.remove(req)


class OverBudget(Scheduler):            # off by one in the budget
    def schedule(self):
        self.max_num_batched_tokens += 1
        try:
            return super().schedule()
        finally:
            self.max_num_batched_tokens -= 1


class NoResetOnPreempt(Scheduler):      # frees the blocks but keeps num_computed_tokens
    def _preempt(self, req):
        cur = req.num_computed_tokens
        super()._preempt(req)
        req.kv.cur_len = cur


class ReserveOnlyFirstChunk(Scheduler):   # running requests never get new blocks
    def _reserve_or_preempt(self, req, n, out):
        return True


class AdmitPastCap(Scheduler):          # max_num_seqs ignored
    def schedule(self):
        cap, self.max_num_seqs = self.max_num_seqs, 10**6
        try:
            return super().schedule()
        finally:
            self.max_num_seqs = cap


class CapOffByOne(Scheduler):          # admits only while len(running) < max_num_seqs - 1
    def schedule(self):
        self.max_num_seqs -= 1
        try:
            return super().schedule()
        finally:
            self.max_num_seqs += 1


class AliasBlocks(Scheduler):           # a new request's block table starts with an older request's block
    def schedule(self):
        out = super().schedule()
        for req in out.admitted:
            others = [r for r in self.running if r is not req and r.blocks]
            if others and req.blocks:
                req.kv.blocks[0] = others[0].blocks[0]
        return out


class PreemptWithoutFree(Scheduler):    # a preempted request's blocks are never returned
    def _preempt(self, req):
        req.kv = KVBlocks(req.request_id)
        req.status = type(req.status).WAITING
        req.num_preemptions += 1
        self.waiting.appendleft(req)


BUGS = [
    (LeakOnFinish, "free + owned = total"),
    (AliasBlocks, "no block is owned twice"),
    (CapOffByOne, "every request finishes (progress every step)"),
    (OverBudget, "each step stays within the token budget"),
    (NoResetOnPreempt, "a preempted request holds nothing and restarts from zero"),
    (ReserveOnlyFirstChunk, "every scheduled request has blocks for all its tokens"),
    (AdmitPastCap, "each step stays within max_num_seqs"),
    (PreemptWithoutFree, "free + owned = total"),
]


# The workload each search below found (make test-deep), already shrunk: the pinned tests re-run it.
PINNED = {
    "LeakOnFinish": Workload(block_size=1, num_blocks=2, budget=1, max_num_seqs=1, requests=[(1, 1, 0)], seed=0),
    "AliasBlocks": Workload(block_size=1, num_blocks=2, budget=2, max_num_seqs=2, requests=[(1, 1, 0), (1, 1, 0)], seed=0),
    "CapOffByOne": Workload(block_size=1, num_blocks=2, budget=1, max_num_seqs=1, requests=[(1, 1, 0)], seed=0),
    "OverBudget": Workload(block_size=1, num_blocks=3, budget=1, max_num_seqs=1, requests=[(2, 1, 0)], seed=0),
    "NoResetOnPreempt": Workload(block_size=4, num_blocks=7, budget=2, max_num_seqs=2, requests=[(22, 4, 0), (1, 3, 0)],
                                 seed=0),
    "ReserveOnlyFirstChunk": Workload(block_size=2, num_blocks=2, budget=1, max_num_seqs=1, requests=[(1, 3, 0)], seed=0),
    "AdmitPastCap": Workload(block_size=1, num_blocks=2, budget=2, max_num_seqs=1, requests=[(1, 1, 0), (1, 1, 0)], seed=0),
    "PreemptWithoutFree": Workload(block_size=3, num_blocks=9, budget=2, max_num_seqs=2,
                                   requests=[(18, 5, 0), (1, 4, 0)], seed=0),
    "chunk boundary": Workload(block_size=1, num_blocks=3, budget=1, max_num_seqs=1, requests=[(1, 2, 0)], seed=0),
}
IDS = lambda x: x.__name__ if isinstance(x, type) else ""   # noqa: E731


@pytest.mark.parametrize("bug,invariant", BUGS, ids=IDS)
def test_l5_pinned_workload_catches_a_planted_scheduler_bug(bug, invariant):
    """The real scheduler passes the pinned workload; the planted bug breaks exactly its invariant."""
    w = PINNED[bug.__name__]
    run(w)
    assert breaks(invariant, run, w, bug, 2000)


@pytest.mark.deep
@pytest.mark.parametrize("bug,invariant", BUGS, ids=IDS)
def test_l5_fuzz_search_finds_a_planted_scheduler_bug(bug, invariant):
    assert finds(invariant, run, workloads(max_requests=6), bug, 2000)


CHUNK_BOUNDARY = "outputs equal the solo run, however the request was chunked or preempted"


def _refeed_before_the_boundary(monkeypatch):
    """A later chunk that re-feeds the token before the boundary (positions right, tokens wrong):
    it passes every block check and is caught only by comparing outputs with the solo run."""
    from l5_scheduler.request import Request
    right = Request.tokens
    monkeypatch.setattr(Request, "tokens", lambda self, start, n: right(self, max(0, start - 1), n))


def test_l5_pinned_workload_catches_a_planted_chunk_boundary_bug(monkeypatch):
    w = PINNED["chunk boundary"]
    run(w)
    _refeed_before_the_boundary(monkeypatch)
    assert breaks(CHUNK_BOUNDARY, run, w, Scheduler, 2000)


@pytest.mark.deep
def test_l5_fuzz_search_finds_a_planted_chunk_boundary_bug(monkeypatch):
    _refeed_before_the_boundary(monkeypatch)
    assert finds(CHUNK_BOUNDARY, run, workloads(max_requests=4), Scheduler, 2000, max_examples=2000)
