"""Steady decode on the host: a step's Python work scales with what changed, not with the batch.

With CUDA graphs the GPU side of a decode step is one launch, and the host is what is left: on
the H200's machine, 1.4 ms per step at 256 running requests (about 5 us per request, mostly paid
while the GPU waits), in code written to be read. Most of a steady decode step changes nothing:

    a steady decode step: every running request computed its last known token in the last step
    and sampled it, so now each computes exactly that one new token and samples again

                    stages 5 and 6, per request          here
    schedule        n = ..., reserve(), _take()          one pass over attributes; the allocator
                                                         is called only for a request whose last
                                                         block is full (1 step in block_size)
    advance         cur_len += 1, "did a block fill?"    cur_len += 1 in one pass; the prefix cache
                    a method call each                   sees only the requests whose block filled
    sample          stage 4's pipeline, per-row checks   argmax, when every row is plain greedy
    stop checks     StopChecker.update() each            a set lookup and a length test; update()
                                                         only when the token could stop the request

Every shortcut decides exactly what the general code would: the fast scheduler takes its path only
when it cannot preempt (every full block can get a new one), so the blocks it hands out are the
same blocks in the same order; anything else (admissions, chunks, a step that might preempt) goes
through stages 5 and 6's code unchanged. tests/test_l7_host.py runs stage 6's scheduler and this
one side by side on random workloads and compares every decision, and runs stage 6's fuzz
invariants on this one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter

from l2_gather.allocator import BlockAllocator
from l5_scheduler.scheduler import Scheduler, SchedulerOutput
from l6_prefix_cache.kv_manager import KVCacheManager
from l6_prefix_cache.scheduler import PrefixCachingScheduler


class WholeBlockSlots:
    """Allocator mixin, two changes:

    * a request's ``slot_indices`` cover every slot of the blocks it holds (stage 2 extends them
      token by token), so "its last block is full" is ``cur_len >= len(slot_indices)``, and a
      decode whose block has room needs no allocator call at all;
    * every handle whose block list grows is logged in ``grown``: the scheduler hands the log to
      the runner with the step (``StepPlan.grown``), which sends the device block table only
      those changes instead of scanning every request for them.
    """

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.grown: list = []

    def reserve(self, handle, n: int) -> None:
        had = len(handle.blocks)
        super().reserve(handle, n)
        bs, slots, blocks = self.block_size, handle.slot_indices, handle.blocks
        if len(blocks) != had:
            self.grown.append(handle)
        i = len(slots)
        if i < len(blocks) * bs:
            if i % bs:                                   # finish the partly covered block
                base = blocks[i // bs] * bs
                slots += range(base + i % bs, base + bs)
            for b in blocks[-(-i // bs):]:               # then the new blocks, whole
                slots += range(b * bs, b * bs + bs)


class BlockSlotsAllocator(WholeBlockSlots, BlockAllocator):
    """Stage 2's allocator, slots a block at a time (prefix caching off)."""


class BlockSlotsKVCacheManager(WholeBlockSlots, KVCacheManager):
    """Stage 6's KV cache manager, slots a block at a time."""


@dataclass
class StepPlan(SchedulerOutput):
    """Stage 5's scheduler output plus the step's block-table diff (vLLM's ``new_block_ids``)."""
    grown: list = field(default_factory=list)     # block handles whose block list grew this step

    @property
    def num_tokens(self) -> int:
        return sum(map(itemgetter(1), self.scheduled))   # the same sum, without a Python loop


class SteadyDecode:
    """Scheduler mixin: a steady decode step is scheduled in one pass (put it before the scheduler
    class in the bases: ``class X(SteadyDecode, Scheduler)``)."""

    output_cls = StepPlan

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.steady = False          # set by advance(): every running request has one token to compute
        self.steady_steps = 0        # steps the one-pass path scheduled (tests, --profile)
        self._decoded = None         # (the output, how many leading pairs the one pass scheduled)

    def schedule(self) -> StepPlan:
        out = super().schedule()
        out.grown, self.alloc.grown = self.alloc.grown, []
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        running = self.running
        S = len(running)
        if not self.steady or not S or S > budget:
            return super()._schedule_running(out, budget)
        full = [r.kv for r in running if r.kv.cur_len >= len(r.kv.slot_indices)]   # need a new block
        if len(full) > self.alloc.num_free:
            return super()._schedule_running(out, budget)   # someone will be preempted: stage 5 picks who
        for kv in full:                                     # in running order: the general loop's blocks
            self.alloc.reserve(kv, kv.cur_len + 1)
        out.scheduled = [(r, 1) for r in running]
        out.sample = [True] * S                             # each computes its last known token
        out.prefill = [False] * S                           # past its prefill since the last step
        self._decoded = (out, S)
        self.steady_steps += 1
        return budget - S

    def advance(self, out: SchedulerOutput) -> None:
        decoded, self._decoded = self._decoded, None
        if decoded is not None and decoded[0] is out:
            k, bs = decoded[1], self.alloc.block_size
            steady = out.scheduled[:k]
            for req, _ in steady:
                req.kv.cur_len += 1
            # The general advance for the rest: admissions (if any), and the decodes whose block just
            # filled (n = 0: already counted), which the prefix cache hashes.
            filled = [req for req, _ in steady if req.kv.cur_len % bs == 0]
            if filled:
                self._blocks_filled(filled)
            if len(out.scheduled) > k:                      # admissions: the general advance
                super().advance(SchedulerOutput(scheduled=out.scheduled[k:]))
        else:
            super().advance(out)
        self.steady = len(out.scheduled) == len(self.running) and all(out.sample)

    def _blocks_filled(self, reqs: list) -> None:
        """Steady decodes whose last block just filled (stage 5 has nothing to do; stage 6 caches it)."""


class SteadyScheduler(SteadyDecode, Scheduler):
    """Stage 5's scheduler (prefix caching off) with the one-pass steady decode."""
    allocator_cls = BlockSlotsAllocator


class SteadyPrefixCachingScheduler(SteadyDecode, PrefixCachingScheduler):
    """Stage 6's scheduler with the one-pass steady decode."""
    allocator_cls = BlockSlotsKVCacheManager

    def _blocks_filled(self, reqs: list) -> None:
        """Stage 6's advance for these requests alone: hash the block each just filled and cache it."""
        bs = self.alloc.block_size
        for req in reqs:
            self.alloc.cache_full_blocks(req.kv, self.block_hashes(req, req.kv.cur_len // bs))


def attach_stop_facts(req, eos_token_ids, max_model_len: int) -> None:
    """What the engine's fast loop needs to know about a request, computed once at ``add``:

    plain_greedy   the sampler reduces to an argmax for it
    stop_ids       the tokens that can end it (EOS unless ignore_eos, stop_token_ids)
    stop_len       the output length at which it may end anyway (max_tokens, the context);
                   0 when it has stop strings, whose text must be checked every step

    A token can finish the request only if ``tok in stop_ids or len(output) >= stop_len``; only
    then is its StopChecker asked, and it decides exactly as in stage 4 (min_tokens included).
    """
    p = req.params
    req.plain_greedy = p.greedy and not p.has_penalties and p.min_tokens == 0 and p.logprobs is None
    req.stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else frozenset(eos_token_ids))
    req.stop_len = 0 if p.stop else min(p.max_tokens, max_model_len - len(req.prompt_ids))
