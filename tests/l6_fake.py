"""A fake model for driving the stage 6 scheduler (prefix caching on) without torch: a workload
runner that checks the block pool's invariants after every step. Used by tests/test_l6_fuzz.py.

As in tests/l5_fake.py, the fake KV cache is a dict ``slot -> (position, token)``; a sampling
request "attends" by reading positions 0..L-1 back through its slot list, and its next token is
a hash of what it read, compared at the end with the same fake model run solo. With sharing, a
slot may legitimately hold another request's token, so the read checks *content*: the slot must
hold this request's token at that position. Prompts are drawn from a few shared documents, so
requests really do share, duplicate and extend each other's prefixes.

The cache invariants (each a test in tests/test_l6_fuzz.py):
    each block's ref_cnt = how many running requests hold it (no request holds a block twice)
    a block is in the free queue exactly when its ref_cnt is 0; free + held = total
    the hash map points only at blocks whose K/V are the prefix that hash was first seen with
    new tokens are written only into private blocks (ref_cnt 1, no hash)
    at the end every ref_cnt is 0 and every block is in the free queue (free or cached)
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from l2_gather.allocator import OutOfBlocks
from l4_sampler.params import SamplingParams
from l5_fake import EOS, V, next_token, solo
from l5_fake import _check as l5_check
from l5_scheduler.request import Request, RequestStatus
from l5_scheduler.scheduler import Scheduler
from l6_prefix_cache.kv_manager import KVCacheManager

CHECKS: Counter = Counter()
EXAMPLES: Counter = Counter()
DOCS = [[(d * 17 + j * 5) % (V - 1) + 1 for j in range(160)] for d in range(3)]   # shared "system prompts"


@dataclass
class Seen:
    """What the checks remember: the prefix each hash was first seen with, the blocks written this
    step, the (block -> hash) pairs whose content was checked, the (request, index, block, hash)
    holdings checked. A check repeated on unchanged state can only pass again, so it is skipped."""
    prefix_of: dict = field(default_factory=dict)
    written: set = field(default_factory=set)
    verified: dict = field(default_factory=dict)
    recorded: set = field(default_factory=set)


@dataclass
class Workload:
    block_size: int
    num_blocks: int
    budget: int
    max_num_seqs: int
    requests: list[tuple[int, int, int, int, int]]   # (doc, shared len, own len, max_tokens, arrival step)


def prompt_of(i: int, doc: int, shared: int, own: int) -> list[int]:
    tail = [(i * 13 + j * 7 + 3) % (V - 1) + 1 for j in range(own)]           # no EOS in prompts
    p = DOCS[doc][:shared] + tail
    return p or [DOCS[doc][0]]


def _check(name: str, ok: bool, detail="") -> None:
    """``detail``: a string, or a function making it (called only when the check fails)."""
    l5_check(name, ok, detail, CHECKS)


def run(w: Workload, scheduler_cls=Scheduler, max_steps: int = 20_000, kv_cls=KVCacheManager) -> dict:
    sched = scheduler_cls(kv_cls(w.num_blocks, w.block_size), w.budget, w.max_num_seqs)
    bs, total = w.block_size, w.num_blocks
    pending = sorted(((a, i, d, s, o, m) for i, (d, s, o, m, a) in enumerate(w.requests)), key=lambda x: x[:2])
    reqs, expect, kv, memo = [], {}, {}, Seen()
    step = hits = 0
    while pending or sched.has_unfinished():
        while pending and pending[0][0] <= step:
            _, i, d, s, o, mt = pending.pop(0)
            prompt = prompt_of(i, d, s, o)
            req = Request(f"r{i}", prompt, SamplingParams(max_tokens=mt), arrival=len(reqs))
            try:
                sched.add(req)
                reqs.append(req)
                expect[req.request_id] = solo(prompt, mt)
            except OutOfBlocks:
                _check("a request that can never fit is rejected at add", len(prompt) + mt > bs * total)
        if not sched.has_unfinished():
            step += 1
            continue
        _check("every request finishes (progress every step)", step < max_steps, lambda: f"step {step}")
        out = sched.schedule()
        _check("every request finishes (progress every step)", len(out.scheduled) > 0, lambda: f"step {step}")
        _check("each step stays within the token budget and max_num_seqs",
               out.num_tokens <= w.budget and len(sched.running) <= w.max_num_seqs)
        _check("every scheduled request computes at least one token (a full hit too)",
               all(n >= 1 for _, n in out.scheduled), lambda: f"{[(r.request_id, n) for r, n in out.scheduled]}")
        step_hits = {r.request_id: r.num_computed_tokens for r in out.admitted}   # found cached at admission
        hits += sum(step_hits.values())
        _pool_invariants(sched, reqs, total, kv, memo)
        for req, n in out.scheduled:                           # write the new tokens' "K/V"
            start = req.num_computed_tokens
            _check("every scheduled request has blocks for all its tokens",
                   len(req.kv.slot_indices) >= start + n, lambda: f"{req.request_id}")
            for j, t in enumerate(req.tokens(start, n)):
                slot = req.kv.slot_indices[start + j]
                b = sched.kv.pool.blocks[slot // bs]
                _check("new tokens are written only into private blocks", b.ref_cnt == 1 and b.block_hash is None,
                       lambda: f"{req.request_id} writes position {start + j} into {b}")
                kv[slot] = (start + j, t)
                memo.written.add(slot // bs)
        sched.advance(out)
        _record_prefixes(sched, memo)
        for (req, n), sample in zip(out.scheduled, out.sample):
            L = req.num_computed_tokens
            _check("a request samples exactly when its last known token was computed", sample == (L == req.num_tokens))
            if not sample:
                continue
            seen = [kv.get(req.kv.slot_indices[p]) for p in range(L)]
            want = req.tokens(0, L)
            bad = [p for p, (s, t) in enumerate(zip(seen, want)) if s != (p, t)]
            _check("attention reads the request's own tokens, at their positions", not bad,
                   lambda: f"{req.request_id} (hit {step_hits.get(req.request_id)}): wrong K/V at positions {bad[:5]}")
            tok = next_token([s[1] for s in seen])
            req.append_output(tok)
            if tok == EOS or len(req.output_ids) == req.params.max_tokens:
                sched.finish(req, "stop" if tok == EOS else "length")
        _pool_invariants(sched, reqs, total, kv, memo)
        step += 1
    for req in reqs:
        _check("every request finishes (progress every step)", req.status == RequestStatus.FINISHED)
        _check("outputs equal the solo run, with the cache and however chunked or preempted",
               req.output_ids == expect[req.request_id],
               lambda: f"{req.request_id} (preempted {req.num_preemptions}x): {req.output_ids} != {expect[req.request_id]}")
    pool = sched.kv.pool
    _check("at the end every count is 0 and every block is free or cached",
           all(b.ref_cnt == 0 for b in pool.blocks) and pool.num_free == total
           and sorted(b.block_id for b in pool.free_queue) == list(range(total)))
    EXAMPLES["workloads"] += 1
    EXAMPLES["steps"] += step
    EXAMPLES["requests"] += len(reqs)
    EXAMPLES["preemptions"] += sum(r.num_preemptions for r in reqs)
    EXAMPLES["cached tokens reused"] += hits
    return {"steps": step, "preemptions": sum(r.num_preemptions for r in reqs), "hits": hits,
            "requests": len(reqs)}


def _pool_invariants(sched, reqs, total, kv, memo: Seen) -> None:
    pool, bs = sched.kv.pool, sched.kv.block_size
    held = Counter(b for r in sched.running for b in r.blocks)
    _check("no request holds a block twice", all(len(set(r.blocks)) == len(r.blocks) for r in sched.running))
    _check("each block's ref_cnt equals the running requests holding it",
           all(pool.blocks[i].ref_cnt == held.get(i, 0) for i in range(total)),
           lambda: f"{[(b, held.get(b.block_id, 0)) for b in pool.blocks if b.ref_cnt != held.get(b.block_id, 0)][:3]}")
    _check("each block's ref_cnt equals the running requests holding it",
           all(not r.blocks for r in reqs if r not in sched.running))
    queue = [b.block_id for b in pool.free_queue]
    _check("no block is free and held at once; free + held = total",
           len(queue) == len(set(queue)) == pool.num_free and not set(queue) & set(held)
           and len(queue) + len(held) == total, lambda: f"free {sorted(queue)} held {sorted(held)}")
    _record_prefixes(sched, memo)
    memo.verified = {b: h for b, h in memo.verified.items() if b not in memo.written}
    memo.written.clear()
    for h, b in pool.cached.items():
        want = memo.prefix_of.get(h)
        _check("the hash map points only at blocks whose content has that hash", b.block_hash == h and want is not None,
               lambda: f"{b} is mapped under {h}; a prefix with that hash: {want}")
        if memo.verified.get(b.block_id) == h:
            continue                      # checked before, and none of its slots written since
        got = [kv.get(b.block_id * bs + j) for j in range(bs)]
        _check("the hash map points only at blocks whose content has that hash",
               got == [(len(want) - bs + j, t) for j, t in enumerate(want[-bs:])],
               lambda: f"{b}: holds {got}, hash is of a prefix ending {want[-bs:]}")
        memo.verified[b.block_id] = h


def _record_prefixes(sched, memo: Seen) -> None:
    """The first running request seen holding a hashed block names the prefix that hash stands for;
    any later holder must have the same prefix. (A request's tokens never change, so each
    (request, block index, block, hash) is checked once.)"""
    pool, bs = sched.kv.pool, sched.kv.block_size
    for r in sched.running:
        for i, b in enumerate(r.blocks[:r.num_computed_tokens // bs]):
            h = pool.blocks[b].block_hash
            if h is not None and (r.request_id, i, b, h) not in memo.recorded:
                want = r.tokens(0, (i + 1) * bs)
                _check("the hash map points only at blocks whose content has that hash",
                       memo.prefix_of.setdefault(h, want) == want,
                       lambda: f"one hash, two prefixes ({r.request_id}, block {i})")
                memo.recorded.add((r.request_id, i, b, h))
