"""The engine's parts written plainly, without their cheap branches: the oracle of tests/test_l7_host.py and
tests/test_l7_host_engine.py, and the baseline of `measure_wall.py --lesson 7`.

Every owner of a decision has a cheap branch for the common step (lessons/l7_fast/5_host_branches.md).
These are the same parts with the branch taken out, so each asks the general question every time:

    PlainScheduler      every running request asks the KV manager for blocks, every step, its
                        token count is len(prompt) + len(output) (no ``num_tokens`` counter, no
                        "its blocks can hold them" pre-check), and whether it samples is asked of
                        each (not "all but a cut last one")
    PlainBlockManager   stage 2's block arithmetic on every call (no "the last block has room" return)
    PlainKVCacheManager the same, and after every step it asks of *every* scheduled request whether a
                        block filled (no block-boundary test)
    PlainSampler        stage 4's whole pipeline for every batch (no all-greedy branch)
    plain_stops(req)    a StopChecker asked at every token (no pre-check)

Nothing in the engine imports this file.
"""
from __future__ import annotations

from l2_gather.allocator import OutOfBlocks, add_blocks
from l4_sampler.sampler import Sampler, _check
from l5_scheduler.kv_manager import BlockManager
from l5_scheduler.scheduler import Scheduler
from l6_prefix_cache.kv_manager import KVCacheManager


class PlainScheduler(Scheduler):
    def _schedule_running(self, out, budget):
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(len(req.prompt_ids) + len(req.output_ids) - req.num_computed_tokens, budget)
            if not self._reserve_or_preempt(req, n, out):
                break
            out.scheduled.append((req, n))
            budget -= n
            i += 1
        out.sample = [req.num_computed_tokens + n == len(req.prompt_ids) + len(req.output_ids)
                      for req, n in out.scheduled]          # does it compute its last known token?
        return budget


def _plain_reserve(manager, take, handle, n):
    """Blocks for n tokens: compute the need from the block count every time."""
    need = manager.blocks_for(n) - len(handle.blocks)
    if need <= 0:
        return
    if need > manager.num_free:
        raise OutOfBlocks(f"{handle.req_id!r} needs {need} blocks, {manager.num_free} free")
    add_blocks(handle, take(need), manager.block_size)
    manager.new_blocks.append(handle)


class PlainBlockManager(BlockManager):
    def reserve(self, handle, n):
        def take(k):
            out = [self._free.popleft() for _ in range(k)]
            for b in out:
                self._owner[b] = handle
            return out
        _plain_reserve(self, take, handle, n)


class PlainKVCacheManager(KVCacheManager):
    def reserve(self, handle, n):
        _plain_reserve(self, lambda k: [b.block_id for b in self.pool.allocate(k)], handle, n)

    def advance(self, scheduled):
        for req, n in scheduled:
            req.kv.cur_len += n
        for req, _ in scheduled:                      # did a block fill? asked of every request
            full = req.num_computed_tokens // self.block_size
            if full > self.num_cached_blocks(req.kv):
                self.cache_full_blocks(req.kv, self.block_hashes(req, full))


class PlainSampler(Sampler):
    def __call__(self, logits, rows, argmax=None):    # (a precomputed argmax is never used)
        for r in rows:                                # the rows' own decision says "not plain": the pipeline
            r.plain_greedy = False
        _check(logits, rows)
        return super().__call__(logits, rows)


def plain_stops(req) -> None:
    """Make the request's StopChecker be asked at every token (the pre-check always lets it through)."""
    req.stops.stop_len = 0
