"""A fake windowed model for driving the stage 8 KV manager (the coordinator: groups, windows, prefix caching) through
stage 5's scheduler without torch. Used by tests/test_l8_fuzz.py.

The fake cache is one dict ``slot -> (group, position, token)``: groups share the pool, so a
block that moves from one group to another must be rewritten before it is read. A sampling
request at length L "attends" in every group: a full group reads positions 0..L-1, a group with
window W reads L-W..L-1 (what the query at L-1 sees), each through that group's slot list. Its
next token is a hash of everything it read, so a solo run with the same windows gives the same
tokens exactly when every read found the right content.

The invariants (each a test in tests/test_l8_fuzz.py):
    a windowed group holds at most ceil((W + n - 1) / block_size) + 1 blocks in a step of n tokens
    no freed block is ever read: every block a step reads is held by the request
    each block's ref_cnt equals the (request, group) lists holding it; free + held = total
    outputs equal the solo run, with windows, however chunked, preempted or prefix-hit
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from l2_gather.allocator import OutOfBlocks
from l4_sampler.params import SamplingParams
from l5_fake import EOS, next_token
from l5_fake import _check as l5_check
from l5_scheduler.request import Request, RequestStatus
from l5_scheduler.scheduler import Scheduler
import l6_fake
from l6_fake import prompt_of
from l8_sliding_window.kv_coordinator import KVCacheCoordinator

CHECKS: Counter = Counter()
EXAMPLES: Counter = Counter()


@dataclass
class Workload(l6_fake.Workload):                    # stage 6's workload, and the groups' windows
    windows: tuple = (None,)                         # per KV cache group: a window or None


def _check(name: str, ok: bool, detail="") -> None:          # detail: a string, or a function making it
    l5_check(name, ok, detail, CHECKS)


def reads(tokens: list[int], windows) -> list[int]:
    L = len(tokens)
    return [t for W in windows for t in (tokens if W is None else tokens[max(0, L - W):])]


def solo(prompt: list[int], max_tokens: int, windows) -> list[int]:
    out = []
    while len(out) < max_tokens:
        out.append(next_token(reads(prompt + out, windows)))
        if out[-1] == EOS:
            break
    return out


def fits_alone(w: Workload, n_tokens: int) -> bool:
    """Blocks a request needs at its largest, with the whole pool to itself (else it could never run)."""
    blocks = -(-n_tokens // w.block_size)
    need = sum(blocks if W is None else min(blocks, math.ceil((W + w.budget - 1) / w.block_size) + 1)
               for W in w.windows)
    return need <= w.num_blocks


def run(w: Workload, kv_cls=KVCacheCoordinator, max_steps: int = 20_000) -> dict:
    kvm = kv_cls(w.num_blocks, w.block_size, list(w.windows))
    sched = Scheduler(kvm, w.budget, w.max_num_seqs)
    pending = sorted(((a, i, d, s, o, m) for i, (d, s, o, m, a) in enumerate(w.requests)), key=lambda x: x[:2])
    store: dict = {}
    reqs, expect, step = [], {}, 0
    while pending or sched.has_unfinished():
        while pending and pending[0][0] <= step:
            _, i, d, s, o, mt = pending.pop(0)
            prompt = prompt_of(i, d, s, o)
            if not fits_alone(w, len(prompt) + mt):  # the driver skips what could never run
                continue
            req = Request(f"r{i}", prompt, SamplingParams(max_tokens=mt), arrival=len(reqs))
            try:
                sched.add(req)                       # stage 5's check: the whole pool's tokens
            except OutOfBlocks:
                _check("a request is rejected at add only when it exceeds the pool",
                       len(prompt) + mt > w.num_blocks * w.block_size)
                continue
            reqs.append(req)
            expect[req.request_id] = solo(prompt, mt, w.windows)
        if sched.has_unfinished():
            _check("every request finishes (progress every step)", step < max_steps, lambda: f"step {step}")
            _step(w, sched, store)
        step += 1
    for req in reqs:
        _check("outputs equal the solo run, with windows, however chunked, preempted or prefix-hit",
               req.status == RequestStatus.FINISHED and req.output_ids == expect[req.request_id],
               lambda: f"{req.request_id} (preempted {req.num_preemptions}x): {req.output_ids} != {expect[req.request_id]}")
    _check("each block's ref_cnt equals the (request, group) lists holding it; free + held = total",
           kvm.num_free == w.num_blocks)
    EXAMPLES["workloads"] += 1
    EXAMPLES["steps"] += step
    EXAMPLES["requests"] += len(reqs)
    EXAMPLES["preemptions"] += sum(r.num_preemptions for r in reqs)
    EXAMPLES["blocks freed by windows"] += kvm.blocks_freed
    EXAMPLES["cached tokens reused"] += kvm.stats.hits
    return {"steps": step, "freed": kvm.blocks_freed, "hits": kvm.stats.hits,
            "preemptions": sum(r.num_preemptions for r in reqs)}


def _step(w: Workload, sched, store) -> None:
    kvm, bs = sched.kv, w.block_size
    out = sched.schedule()
    _check("every request finishes (progress every step)", len(out.scheduled) > 0)
    _pool_invariants(sched)
    for req, n in out.scheduled:
        start = req.num_computed_tokens
        for g, (h, W) in enumerate(zip(kvm.handles(req.kv), w.windows)):
            if W is not None:
                bound = math.ceil((W + n - 1) / bs) + 1
                _check("a windowed group holds at most ceil((W + n - 1) / block_size) + 1 blocks",
                       kvm.held(req.kv, g) <= bound, lambda: f"{req.request_id} group {g}: {kvm.held(req.kv, g)} > {bound}")
            for j, t in enumerate(req.tokens(start, n)):
                store[h.slot_indices[start + j]] = (g, start + j, t)
    tokens = {}                                      # the forward pass reads, before advance frees
    for (req, n), sample in zip(out.scheduled, out.sample):
        if sample:
            tokens[req.request_id] = next_token(_read(kvm, store, req, req.num_computed_tokens + n, w.windows))
    sched.advance(out)
    for (req, n), sample in zip(out.scheduled, out.sample):
        if sample:
            tok = tokens[req.request_id]
            req.append_output(tok)
            if tok == EOS or len(req.output_ids) == req.params.max_tokens:
                sched.finish(req, "stop" if tok == EOS else "length")
    _pool_invariants(sched)


def _read(kvm, store, req, L: int, windows) -> list[int]:
    """What the query at position L - 1 reads in every group, checked against what was written there."""
    bs, seen = kvm.block_size, []
    for g, (h, W) in enumerate(zip(kvm.handles(req.kv), windows)):
        held = set(h.blocks[kvm.skipped(req.kv, g):])
        for p in range(0 if W is None else max(0, L - W), L):
            blk = h.blocks[p // bs]
            _check("no freed block is ever read: every block a step reads is held by the request",
                   blk in held and kvm.pool.blocks[blk].ref_cnt >= 1, lambda: f"{req.request_id} g{g} position {p}")
            seen.append(store.get(h.slot_indices[p]))
    want = [(g, p, t) for g, W in enumerate(windows) for p, t in enumerate(req.tokens(0, L)) if W is None or p >= L - W]
    _check("outputs equal the solo run, with windows, however chunked, preempted or prefix-hit", seen == want,
           lambda: f"{req.request_id}: read the wrong K/V")
    return [t for _, _, t in seen]


def _pool_invariants(sched) -> None:
    kvm = sched.kv
    held = Counter(b for r in sched.running for g in range(len(kvm.windows))
                   for b in kvm.handles(r.kv)[g].blocks[kvm.skipped(r.kv, g):])
    pool = kvm.pool
    _check("each block's ref_cnt equals the (request, group) lists holding it; free + held = total",
           all(pool.blocks[i].ref_cnt == held.get(i, 0) for i in range(kvm.num_blocks))
           and pool.num_free + len(held) == kvm.num_blocks,
           lambda: f"{[(b, held.get(b.block_id, 0)) for b in pool.blocks if b.ref_cnt != held.get(b.block_id, 0)][:3]}")
