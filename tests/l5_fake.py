"""A fake model for driving the stage 5 scheduler without torch: a workload runner that checks
the scheduler's invariants after every step. Used by tests/test_l5_fuzz.py.

The fake KV cache is a dict ``slot -> (request arrival, position, token)``. Each step writes the
scheduled tokens into the slots the request's blocks give them; a request that samples then
"attends": it reads every position 0..L-1 back through its slot list and checks that each slot
holds *its own* token at *that* position (a block shared with another request, a stale block
after preemption, or a wrong slot shows up here). Its next token is a hash of what it read, so
any corruption also changes its output, which is compared with the same fake model run solo.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from l2_gather.allocator import OutOfBlocks
from l4_sampler.params import SamplingParams
from l5_scheduler.kv_manager import BlockManager
from l5_scheduler.request import Request, RequestStatus
from l5_scheduler.scheduler import Scheduler

V, EOS = 50, 0

#: invariant name -> how many times it was checked (reported at the end of the test session)
CHECKS: Counter = Counter()
EXAMPLES: Counter = Counter()


class Violation(AssertionError):
    def __init__(self, invariant: str, detail: str):
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant


def next_token(tokens: list[int]) -> int:
    h = len(tokens)
    for t in tokens:
        h = (h * 1_000_003 + t + 7) % 2_147_483_647
    return h % V


def solo(prompt: list[int], max_tokens: int) -> list[int]:
    """What the fake model gives for this request alone: greedy until EOS or max_tokens."""
    out = []
    while len(out) < max_tokens:
        out.append(next_token(prompt + out))
        if out[-1] == EOS:
            break
    return out


@dataclass
class Workload:
    block_size: int
    num_blocks: int
    budget: int
    max_num_seqs: int
    requests: list[tuple[int, int, int]]     # (prompt_len, max_tokens, arrival step)
    seed: int = 0


def _check(name: str, ok: bool, detail="", counter: Counter = CHECKS) -> None:
    """``detail``: a string, or a function making it (called only when the check fails: building
    it every step costs more than the checks)."""
    counter[name] += 1
    if not ok:
        raise Violation(name, detail() if callable(detail) else detail)


def only(invariant: str, run_fn, *args) -> None:
    """Run a workload; fail only if ``invariant`` is the one broken (the others are their own tests)."""
    try:
        run_fn(*args)
    except Violation as v:
        if v.invariant == invariant:
            raise


def search(invariant: str, run_fn, strategy, *args, max_examples: int = 3000):
    """The shrunk workload on which ``run_fn(w, *args)`` breaks ``invariant``, or None if hypothesis
    finds none. (A planted bug that crashes first, or breaks another invariant, does not count.)"""
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    def broken(w):
        try:
            run_fn(w, *args)
        except Violation as v:
            return v.invariant == invariant
        except Exception:
            return False
        return False
    try:
        return find(strategy, broken, settings=settings(max_examples=max_examples, derandomize=True, deadline=None,
                                                        database=None, suppress_health_check=list(HealthCheck)))
    except NoSuchExample:
        return None


def finds(invariant: str, run_fn, strategy, *args, max_examples: int = 3000) -> bool:
    """Does hypothesis find a workload on which ``run_fn(w, *args)`` breaks ``invariant``?"""
    return search(invariant, run_fn, strategy, *args, max_examples=max_examples) is not None


def breaks(invariant: str, run_fn, w, *args) -> bool:
    """Does this one workload break ``invariant`` (and not another first)?"""
    try:
        run_fn(w, *args)
    except Violation as v:
        return v.invariant == invariant
    return False


def run(w: Workload, scheduler_cls=Scheduler, max_steps: int = 20_000, kv_cls=BlockManager) -> dict:
    sched = scheduler_cls(kv_cls(w.num_blocks, w.block_size), w.budget, w.max_num_seqs)
    bs, total = w.block_size, w.num_blocks
    pending = sorted(((step, i, p, m) for i, (p, m, step) in enumerate(w.requests)), key=lambda x: (x[0], x[1]))
    reqs, expect, kv = [], {}, {}
    step = 0
    while pending or sched.has_unfinished():
        while pending and pending[0][0] <= step:                  # arrivals of this step
            _, i, plen, mt = pending.pop(0)
            prompt = [(w.seed * 31 + i * 7 + j * 3) % (V - 1) + 1 for j in range(plen)]   # no EOS in prompts
            req = Request(f"r{i}", prompt, SamplingParams(max_tokens=mt), arrival=len(reqs))   # add order
            fits = plen + mt <= bs * total
            try:
                sched.add(req)
                _check("a request that can never fit is rejected at add, others accepted", fits)
                reqs.append(req)
                expect[req.request_id] = solo(prompt, mt)
            except OutOfBlocks:
                _check("a request that can never fit is rejected at add, others accepted", not fits)
        if not sched.has_unfinished():
            step += 1
            continue
        _check("every request finishes (progress every step)", step < max_steps, lambda: f"step {step}")
        waiting_before = list(sched.waiting)
        out = sched.schedule()
        _check("every request finishes (progress every step)", len(out.scheduled) > 0,
               lambda: f"nothing scheduled at step {step} with {len(sched.waiting)} waiting, {len(sched.running)} running")
        _check("each step stays within the token budget", out.num_tokens <= w.budget, lambda: f"{out.num_tokens} > {w.budget}")
        _check("each step stays within max_num_seqs", len(sched.running) <= w.max_num_seqs)
        _check("each step stays within the token budget", all(n >= 1 for _, n in out.scheduled))
        _check("no request is admitted in a step that preempted", not (out.preempted and out.admitted))
        _check("waiting requests are served first come first served",
               [r.arrival for r in sched.waiting] == sorted(r.arrival for r in sched.waiting))
        for r in out.preempted:
            _check("a preempted request holds nothing and restarts from zero",
                   r.status == RequestStatus.WAITING and r.num_computed_tokens == 0 and not r.blocks)
        _check("waiting requests are served first come first served",
               all(r in waiting_before for r in out.admitted))
        _blocks_invariant(sched, reqs, total)
        for req, n in out.scheduled:                           # write the new tokens' "K/V"
            start = req.num_computed_tokens
            _check("every scheduled request has blocks for all its tokens",
                   len(req.blocks) * bs >= start + n and len(req.kv.slot_indices) >= start + n,
                   lambda: f"{req.request_id}: {len(req.blocks)} blocks of {bs} for {start + n} tokens")
            for j, t in enumerate(req.tokens(start, n)):
                kv[req.kv.slot_indices[start + j]] = (req.arrival, start + j, t)
        sched.advance(out)
        for (req, n), sample in zip(out.scheduled, out.sample):
            L = req.num_computed_tokens
            _check("a request samples exactly when its last known token was computed", sample == (L == req.num_tokens))
            if not sample:
                continue
            seen = [kv.get(req.kv.slot_indices[p]) for p in range(L)]      # the fake attention read
            _check("attention reads only the request's own tokens, at their positions",
                   all(s is not None and s[0] == req.arrival and s[1] == p for p, s in enumerate(seen)),
                   lambda: f"{req.request_id} read {[s for s in seen if s is None or s[0] != req.arrival][:3]}")
            tok = next_token([s[2] for s in seen])
            req.append_output(tok)
            if tok == EOS or len(req.output_ids) == req.params.max_tokens:
                sched.finish(req, "stop" if tok == EOS else "length")
        _blocks_invariant(sched, reqs, total)
        step += 1
    for req in reqs:
        _check("every request finishes (progress every step)", req.status == RequestStatus.FINISHED)
        _check("outputs equal the solo run, however the request was chunked or preempted",
               req.output_ids == expect[req.request_id],
               lambda: f"{req.request_id} (preempted {req.num_preemptions}x): {req.output_ids} != {expect[req.request_id]}")
    _check("at the end the pool is entirely free", sched.kv.num_free == total, lambda: f"{sched.kv.num_free}/{total}")
    EXAMPLES["workloads"] += 1
    EXAMPLES["steps"] += step
    return {"steps": step, "preemptions": sum(r.num_preemptions for r in reqs), "requests": len(reqs)}


def _blocks_invariant(sched, reqs, total) -> None:
    owned = [b for r in sched.running for b in r.blocks]
    _check("no block is owned twice", len(owned) == len(set(owned)), lambda: f"{sorted(owned)}")
    _check("free + owned = total", len(owned) + sched.kv.num_free == total,
           lambda: f"{len(owned)} owned + {sched.kv.num_free} free != {total}")
    _check("free + owned = total", all(not r.blocks for r in reqs if r not in sched.running))
