"""The scheduler's and KV manager's cheap branches decide exactly what the plain code decides
(lessons/l7_fast/5_host_branches.md; the sampler's, the stop check's and the engine's:
tests/test_l7_host_engine.py).

Each owner of a decision has a cheap branch for the common step: the scheduler asks the KV manager
only when a request's blocks cannot hold its next tokens; the allocator returns at once while the
last block has room; the prefix cache hashes only where a block boundary was crossed.
harness/plain_parts.py has the same parts without the branches.

Lockstep: the real scheduler and KV manager and the plain ones run the same workloads side by side
(shared prefixes, chunking, preemption, eviction); after every schedule and every advance the two
must agree on everything observable. A planted bug in each branch is caught.
"""
import pytest
from hypothesis import given

import l6_fake
from l4_sampler.params import SamplingParams
from l5_fake import EOS, Violation, next_token
from l5_scheduler.kv_manager import BlockManager
from l5_scheduler.request import Request
from l5_scheduler.scheduler import Scheduler
from l6_prefix_cache.kv_manager import KVCacheManager
from harness.plain_parts import PlainBlockManager, PlainKVCacheManager, PlainScheduler
from test_l6_fuzz import workloads as l6_workloads

REAL = {"stage 6": (Scheduler, KVCacheManager), "stage 5": (Scheduler, BlockManager)}
PLAIN = {"stage 6": (PlainScheduler, PlainKVCacheManager), "stage 5": (PlainScheduler, PlainBlockManager)}
SKIPPED = {"stage 6": 0, "stage 5": 0}            # running requests that did not ask the KV manager (must be > 0)


def _view(sched, out):
    """Everything a step's caller can observe, by request id."""
    ids = lambda reqs: [r.request_id for r in reqs]   # noqa: E731
    reqs = {r.request_id: r for r in list(sched.running) + list(sched.waiting)}
    kv = sched.kv
    return dict(pairs=[(r.request_id, n) for r, n in out.scheduled], sample=list(out.sample), num_tokens=out.num_tokens,
                prefill=list(out.prefill), preempted=ids(out.preempted), admitted=ids(out.admitted),
                new_blocks=sorted(h.req_id for h in out.new_blocks), finished=list(out.finished_ids),
                free=kv.num_free, cached=sorted(b.block_id for b in kv.pool.cached.values()) if hasattr(kv, "pool") else [],
                running=ids(sched.running), waiting=ids(sched.waiting),
                kv={rid: (r.kv.blocks[:], r.kv.slot_indices[:], r.kv.cur_len) for rid, r in reqs.items()})


def lockstep(w, plain, real, max_steps=20_000) -> tuple[int, int]:
    """Run workload ``w`` (an l6_fake.Workload) on both; Violation on the first difference. Returns how
    many running requests the real scheduler scheduled without asking the KV manager, and how many
    it preempted."""
    a = plain[0](plain[1](w.num_blocks, w.block_size), w.budget, w.max_num_seqs)
    b = real[0](real[1](w.num_blocks, w.block_size), w.budget, w.max_num_seqs)
    asked = []                                                    # running requests that asked and got blocks
    ask = b._reserve_or_preempt
    b._reserve_or_preempt = lambda req, n, out: ask(req, n, out) and not asked.append(req)
    pending = sorted(((arr, i, d, s, o, m) for i, (d, s, o, m, arr) in enumerate(w.requests)), key=lambda x: x[:2])
    step = skipped = preempted = 0
    while pending or a.has_unfinished():
        while pending and pending[0][0] <= step:
            _, i, d, s, o, mt = pending.pop(0)
            prompt = l6_fake.prompt_of(i, d, s, o)
            if len(prompt) + mt > w.block_size * w.num_blocks:
                continue                                          # rejected at add by both
            for sched in (a, b):
                sched.add(Request(f"r{i}", prompt, SamplingParams(max_tokens=mt), arrival=i))
        if not a.has_unfinished():
            step += 1
            continue
        if step > max_steps:
            raise Violation("the real parts decide as the plain ones", "no progress")
        asked.clear()
        outs = a.schedule(), b.schedule()
        skipped += len(outs[1].scheduled) - len(outs[1].admitted) - len(asked)
        preempted += len(outs[1].preempted)
        for when in ("schedule", "advance"):
            if when == "advance":
                a.advance(outs[0])
                b.advance(outs[1])
            va, vb = _view(a, outs[0]), _view(b, outs[1])
            if va != vb:
                k = next(k for k in va if va[k] != vb[k])
                raise Violation("the real parts decide as the plain ones",
                                f"step {step}, after {when}: {k} differ: {str(va[k])[:200]} != {str(vb[k])[:200]}")
        for sched, out in zip((a, b), outs):                     # the same fake tokens for both
            for (req, _), sample in zip(out.scheduled, out.sample):
                if sample:
                    req.append_output(next_token(req.prompt_ids + req.output_ids))
                    if req.output_ids[-1] == EOS or len(req.output_ids) == req.params.max_tokens:
                        sched.finish(req, "stop")
        step += 1
    return skipped, preempted


@pytest.mark.fuzz
@pytest.mark.parametrize("stage", list(REAL))
@given(w=l6_workloads())
def test_l7_real_parts_decide_exactly_as_the_plain_ones(stage, w):
    SKIPPED[stage] += lockstep(w, PLAIN[stage], REAL[stage])[0]


def test_l7_lockstep_skipped_the_kv_manager_for_most_running_requests():
    """Runs after the property test above (pytest keeps file order): the real scheduler did skip the
    KV manager for running requests, so the equality is not vacuous."""
    if not all(SKIPPED.values()):
        pytest.skip("run with the lockstep property test (same file) to count the skipped calls")
    assert all(n > 0 for n in SKIPPED.values()), SKIPPED


SMALL = l6_fake.Workload(2, 12, 8, 3, [(0, 10, 3, 10, 0), (0, 10, 5, 8, 0), (0, 10, 0, 6, 2), (0, 12, 0, 5, 3)])
CHUNKED = l6_fake.Workload(4, 16, 4, 4, [(1, 0, 4, 12, 0), (2, 0, 12, 6, 3), (0, 8, 2, 12, 1)])
# Steady decodes that outgrow the pool: a request that needs a block must preempt the youngest.
SHORT = l6_fake.Workload(2, 7, 16, 3, [(0, 0, 2, 8, 0), (1, 0, 2, 8, 0), (2, 0, 2, 8, 0)])


@pytest.mark.parametrize("w", [SMALL, CHUNKED, SHORT], ids=["small", "chunked", "short"])
@pytest.mark.parametrize("stage", list(REAL))
def test_l7_lockstep_on_fixed_workloads_skips_calls_and_preempts(stage, w):
    skipped, preempted = lockstep(w, PLAIN[stage], REAL[stage])
    assert skipped > 0 and (preempted > 0 or w is CHUNKED)


# ---- planted bugs in the cheap branches: the lockstep driver must find each ---------------------
class RoomCheckOffByOne(Scheduler):        # "its blocks can hold them" off by one: a full block is not refilled
    def _schedule_running(self, out, budget):
        for req in self.running:
            if budget <= 0:
                break
            n = min(req.num_tokens - req.kv.cur_len, budget)
            if req.kv.cur_len + n > len(req.kv.slot_indices) + 1 and not self._reserve_or_preempt(req, n, out):
                break
            out.scheduled.append((req, n))
            budget -= n
        out.sample = [True] * len(out.scheduled)
        return budget


class AssumesDecode(Scheduler):            # every running request computes one token: forgets chunked prefills
    def _schedule_running(self, out, budget):
        for req in self.running:
            if budget <= 0:
                break
            if req.kv.cur_len + 1 > len(req.kv.slot_indices) and not self._reserve_or_preempt(req, 1, out):
                break
            out.scheduled.append((req, 1))
            budget -= 1
        out.sample = [True] * len(out.scheduled)
        return budget


class SkipsWhenShort(Scheduler):           # a request the pool cannot serve waits instead of preempting
    def _reserve_or_preempt(self, req, n, out):
        if self.kv.blocks_for(req.kv.cur_len + n) - len(req.kv.blocks) > self.kv.num_free:
            return True
        return super()._reserve_or_preempt(req, n, out)


class RoomReturnOffByOne(KVCacheManager):  # the allocator's "last block has room" return, off by one
    def reserve(self, handle, n):
        if n <= len(handle.slot_indices) + 1 and handle.blocks:
            return
        super().reserve(handle, n)


class ForgetsFilledBlocks(KVCacheManager):  # the block-boundary test misses a decode's filled block
    def advance(self, scheduled):
        bs = self.block_size
        for req, n in scheduled:
            kv = req.kv
            kv.cur_len += n
            if n > 1 and kv.cur_len // bs > (kv.cur_len - n) // bs:
                self.cache_full_blocks(kv, self.block_hashes(req, kv.cur_len // bs))


@pytest.mark.parametrize("bug,w", [((RoomCheckOffByOne, KVCacheManager), CHUNKED), ((AssumesDecode, KVCacheManager), CHUNKED),
                                   ((Scheduler, RoomReturnOffByOne), CHUNKED), ((Scheduler, ForgetsFilledBlocks), CHUNKED),
                                   ((SkipsWhenShort, KVCacheManager), SHORT)],
                         ids=lambda x: "+".join(c.__name__ for c in x) if isinstance(x, tuple) else "")
def test_l7_lockstep_passes_the_real_parts_where_a_planted_bug_fails(bug, w):
    lockstep(w, PLAIN["stage 6"], REAL["stage 6"])
    with pytest.raises(Violation):
        lockstep(w, PLAIN["stage 6"], bug)
