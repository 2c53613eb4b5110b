"""A fake model for driving the real engine loop with async scheduling on (stage 5's LLMEngine with
stage 7's overlapped step order, stage 6's prefix cache, stage 4's Sampler) without a network. Used by
tests/test_l7_async.py.

The runner is tests/l11_fake.py's: every scheduled token is written into its slot of a dict, and
every position that samples reads 0..p back through the slot list and checks that each slot
holds the request's own token there; the logits put the top score on a hash of what it read, so
greedy outputs must equal the solo run (tests/l5_fake.py). EOS (token 0) comes up about once in
50 tokens, so requests end both by EOS and by length. This one also records, per request, the
last position any step computed.

The invariants (tests/test_l7_async.py):
    outputs equal the solo run, however chunked, preempted, prefix-hit or aborted beside
    every position a step reads holds the request's own token
    a request that ends by length is never scheduled past its last token; one that ends by EOS
        computes at most one position past it (the step launched before its stop was seen)
    every request finishes; at the end every block is free or cached
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

from l4_sampler.sampler import Sampler
from l5_fake import _check as l5_check
from l5_fake import EOS, V
from l5_scheduler.config import EngineConfig
from l5_scheduler.engine import LLMEngine
from l5_scheduler.scheduler import Scheduler
import l6_fake
from l6_prefix_cache.kv_manager import KVCacheManager
from l7_fast.step import OverlappedStep
from l11_fake import FakeRunner, arrivals, arrive

CHECKS: Counter = Counter()
EXAMPLES: Counter = Counter()


@dataclass
class Workload(l6_fake.Workload):                     # stage 6's workload, and aborts
    aborts: list[tuple[int, int]] = field(default_factory=list)   # (request index, step): abort it then


def _check(name: str, ok: bool, detail="") -> None:
    l5_check(name, ok, detail, CHECKS)


class Runner(FakeRunner):
    def __init__(self):
        super().__init__()
        self.last: dict[str, int] = {}                # request id -> the last position a step computed
        self.in_flight: dict[str, tuple] = {}         # as stage 7's runner: tokens not on the host yet

    def execute(self, out):
        for req, n in out.scheduled:
            self.last[req.request_id] = max(self.last.get(req.request_id, -1), req.kv.cur_len + n - 1)
        return super().execute(out)

    def tokens(self, req, start: int, n: int) -> list[int]:
        """``req.tokens``, with a token in flight read from the sampler's output (what fill_in_flight
        does on the device; the fake's sampler ran on the CPU, so it is there already)."""
        ids = req.tokens(start, n)
        got = self.in_flight.get(req.request_id)
        if got is not None and len(ids) < n:
            ids.append(int(got[0][got[1]]))
        return ids


def build(w: Workload, scheduler_cls=Scheduler, step_cls=OverlappedStep) -> LLMEngine:
    """``step_cls`` None: stage 5's order."""
    config = EngineConfig(w.block_size, w.num_blocks, w.budget, w.max_num_seqs, 100_000)
    model = SimpleNamespace(cfg=SimpleNamespace(vocab_size=V, eos_token_ids=(EOS,)))
    sched = scheduler_cls(KVCacheManager(w.num_blocks, w.block_size), w.budget, w.max_num_seqs)
    runner = Runner()
    return LLMEngine(model, None, config, scheduler=sched, runner=runner, sampler=Sampler(0),
                     step=step_cls(runner) if step_cls is not None else None)


def run(w: Workload, scheduler_cls=Scheduler, step_cls=OverlappedStep, max_steps: int = 20_000) -> dict:
    eng = build(w, scheduler_cls, step_cls)
    sched = eng.scheduler
    pending = arrivals(w)
    aborts = sorted((step, i) for i, step in w.aborts)
    expect, ids, aborted, step, reqs = {}, {}, set(), 0, {}
    while pending or eng.has_unfinished_requests():
        for i, rid in arrive(eng, pending, step, expect).items():
            ids[i], reqs[rid] = rid, eng.requests[rid]
        while aborts and aborts[0][0] <= step:
            rid = ids.get(aborts.pop(0)[1])
            if rid is not None and rid in eng.requests and not eng.output(rid).finished:
                eng.abort_request(rid)
                aborted.add(rid)
        if eng.has_unfinished_requests():
            _check("every request finishes (progress every step)", step < max_steps, lambda: f"step {step}")
            eng.step()
        step += 1
    for rid, want in expect.items():
        if rid in aborted:
            continue
        req, last = reqs[rid], eng.runner.last.get(rid, -1)
        got, P = req.output_ids, len(req.prompt_ids)
        _check("outputs equal the solo run, however chunked, preempted, prefix-hit or aborted beside", got == want,
               lambda: f"{rid}: {got} != {want}")
        limit = P + len(got) - 2 if req.finish_reason == "length" else P + len(got) - 1
        _check("a request is never scheduled past its last token (one wasted position after a stop)", last <= limit,
               lambda: f"{rid} ({req.finish_reason}, {P} + {len(got)} tokens) computed position {last}")
    _check("every request finishes; at the end every block is free or cached", sched.kv.num_free == w.num_blocks,
           lambda: f"{sched.kv.num_free} of {w.num_blocks} free")
    stops = sum(1 for rid in expect if rid not in aborted and reqs[rid].finish_reason == "stop")
    for key, v in (("workloads", 1), ("steps", step), ("requests", len(expect)), ("ended by EOS", stops),
                   ("aborted", len(aborted)), ("cached tokens reused", sched.kv.stats.hits)):
        EXAMPLES[key] += v
    return {"steps": step, "stops": stops, "aborted": len(aborted), "hits": sched.kv.stats.hits,
            "preemptions": sum(r.num_preemptions for r in reqs.values())}
