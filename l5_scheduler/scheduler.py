"""The scheduler: every step, which requests run and how many tokens each gets.

Plain Python on host ints (no torch), so it is tested without a model (tests/test_l5_fuzz.py).
One token budget per step and one cap on running requests, as in vLLM v1; there are no
separate prefill and decode phases:

    budget = max_num_batched_tokens
    1. running requests, oldest admission first:
         n = min(num_tokens - num_computed_tokens, budget)       decode: 1; prefill: a chunk
         reserve blocks for num_computed + n tokens; if none are free, preempt the most
         recently admitted running request (it may be this one) and try again
    2. only if nothing was preempted: admit waiting requests, first come first served, while
         budget > 0, len(running) < max_num_seqs and their first chunk's blocks are free

    step 7, budget 32:  A decode 1 | B decode 1 | C chunk 30 of its 300-token prompt    -> 32

Where the K/V go is not the scheduler's business: it is given a KV manager (kv_manager.py, stage
2's allocator by default, or another with the same calls) and asks it for blocks. A running
request asks only when its blocks cannot hold its next tokens (1 decode step in block_size).

Preemption is by recompute: the victim frees every block, its ``num_computed_tokens`` drops
to 0 and it goes back to the *front* of the waiting queue. When readmitted it recomputes its
prompt plus the tokens it already generated, then samples its next token as if nothing had
happened. Victims are taken from the back of ``running``, so the oldest request is never
preempted by a younger one: it always progresses, and every request finishes.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from l2_gather.allocator import OutOfBlocks
from plumbing.exercise import learner_can_replace

from .outputs import StepOutput
from .request import KVBlocks, Request, RequestStatus


@learner_can_replace  # lesson 5's build-it exercise: exercises/l5_scheduler.py
def reserve_or_preempt(alloc, running: list[Request], req: Request, n: int, preempt) -> bool:
    """Blocks for ``req``'s next ``n`` tokens, preempting the youngest running requests until they fit.

    Reserve room for ``num_computed_tokens + n`` tokens. While the pool is short, take the most
    recently admitted request off the end of ``running`` and ``preempt`` it (frees its blocks,
    requeues it). Returns False when ``req`` itself had to go (it cannot run this step).
    """
    while True:
        try:
            alloc.reserve(req.kv, req.num_computed_tokens + n)
            return True
        except OutOfBlocks:
            victim = running.pop()                            # most recently admitted
            preempt(victim)
            if victim is req:
                return False


@dataclass
class SchedulerOutput:
    """One step's plan, and what changed since the last one (a runner that keeps state reads it)."""
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, new tokens), batch order
    sample: list[bool] = field(default_factory=list)     # per scheduled request: does it sample this step?
    prefill: list[bool] = field(default_factory=list)    # per scheduled request: (re)computing, not decoding
    num_tokens: int = 0                                   # sum of the scheduled tokens
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)   # finished since the last step (vLLM: finished_req_ids)
    new_blocks: list = field(default_factory=list)           # block handles that grew (vLLM: new_block_ids)
    prompt_rows: list[int] | None = None   # per scheduled request: logits rows for prompt_logprobs before its
                                           # sampling row (request.prompt_logits_rows); None: no request has any


class Scheduler:
    def __init__(self, kv, max_num_batched_tokens: int, max_num_seqs: int):
        self.kv = kv                                # the KV manager (kv_manager.py)
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        self.waiting: deque[Request] = deque()     # FCFS; preempted requests go back to the front
        self.running: list[Request] = []           # admission order: the last one is preempted first
        self.finished_ids: list[str] = []          # finished since the last schedule()
        self.num_preemptions = 0                   # preemptions since start (for people: /metrics)

    @property
    def capacity(self) -> int:
        """Tokens the whole pool holds."""
        return self.kv.num_blocks * self.kv.block_size

    def add(self, req: Request) -> None:
        need = len(req.prompt_ids) + req.params.max_tokens
        if need > self.capacity:   # could never run, even alone: reject now, never wait forever
            raise OutOfBlocks(f"prompt ({len(req.prompt_ids)}) + max_tokens ({req.params.max_tokens}) = {need} "
                              f"tokens exceeds the whole KV pool of {self.capacity} tokens")
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_ids=self.finished_ids)
        self.finished_ids = []
        budget = self._schedule_running(out, self.max_num_batched_tokens)     # 1. running requests first
        if not out.preempted:                                                  # 2. then admit
            budget = self._admit_waiting(out, budget)
        out.num_tokens = self.max_num_batched_tokens - budget
        # Before the forward pass, num_computed_tokens is where each request's tokens start.
        out.prefill = [req.kv.cur_len < req.prefill_len for req, _ in out.scheduled]
        if any(out.prefill):                               # prompt logprobs: only a prefill step can owe them
            rows = [req.prompt_logits_rows(req.kv.cur_len, n) for req, n in out.scheduled]
            out.prompt_rows = rows if any(rows) else None
        out.new_blocks, self.kv.new_blocks = self.kv.new_blocks, []
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Step 1: the running requests, oldest admission first. Returns the budget left.

        A request samples when this step computes its last known token. Every running request
        gets all the tokens it has left but the last one, whose chunk the budget may have cut:
        so all of them sample, unless that last one was cut."""
        scheduled, cut = out.scheduled, False
        for req in self.running:                      # a preemption pops from the end: the loop ends sooner
            if budget <= 0:
                break
            kv = req.kv
            n = req.num_tokens - kv.cur_len           # decode: 1; prefill: the rest of it
            if n <= 0:
                continue                              # no token to compute until its next one is known
            if n > budget:
                n, cut = budget, True                 # a chunk: the budget ends here
            if kv.cur_len + n > len(kv.slot_indices):     # its blocks cannot hold them: ask for more
                if not self._reserve_or_preempt(req, n, out):
                    cut = False                       # it preempted itself: nothing younger is left
                    break
            scheduled.append((req, n))
            budget -= n
        out.sample = [True] * len(scheduled)
        if cut:
            out.sample[-1] = False
        return budget

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Step 2: admit waiting requests, first come first served, while budget, cap and blocks allow.
        A request's first admission records its time and the tokens the KV manager found computed."""
        now = None
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            n = self.kv.admit(req, budget)            # the first chunk's blocks only
            if n is None:
                break                                 # no skipping ahead of the queue
            self.waiting.popleft()
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now = now or time.monotonic()
                req.num_cached_tokens = req.kv.cur_len
            req.status, req.prefill_len = RequestStatus.RUNNING, req.num_tokens
            self.running.append(req)
            out.admitted.append(req)
            out.scheduled.append((req, n))
            out.sample.append(req.kv.cur_len + n == req.num_tokens)
            budget -= n
        return budget

    def _reserve_or_preempt(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        def preempt(victim):
            self._preempt(victim)
            out.preempted.append(victim)
        return reserve_or_preempt(self.kv, self.running, req, n, preempt)

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.kv)
        req.kv = KVBlocks(req.request_id)                     # num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)                          # first in line to come back

    def advance(self, out: SchedulerOutput) -> None:
        """After the forward pass: the scheduled tokens' K/V are now in the cache."""
        self.kv.advance(out.scheduled)

    def update_from_output(self, ran) -> tuple[list[StepOutput], list[str]]:
        """The one path by which tokens join requests (vLLM's ``Scheduler.update_from_output``): per
        request that sampled (``ran``: a ``ModelRunnerOutput``), append its new tokens in order,
        count them, keep their logprobs, and run its stop checks; a request that stops frees its
        blocks now, and the tokens after its stop are dropped. Returns the step's outputs and the
        ids that finished."""
        results, finished, now = [], [], time.monotonic()
        for i, req in enumerate(ran.reqs):
            toks, stops, fin = ran.token_ids[i], req.stops, None
            if req.first_token_time is None:
                req.first_token_time = now
            req.last_token_time = now
            lps = ran.logprobs[i] if ran.logprobs is not None else None
            for j, tok in enumerate(toks):
                req.output_ids.append(tok)                 # Request.append_output, inlined (hot path;
                req.num_tokens += 1                        # the sampler's RowState shares the list)
                if lps is not None and lps[j] is not None:
                    req.logprobs.append(lps[j])
                    req.cumulative_logprob += lps[j].logprob
                if ran.logits is not None:
                    req.logits.append(ran.logits[i][j])
                if tok in stops.stop_ids or req.num_tokens >= stops.stop_len:   # could it end here?
                    fin = stops.update(req.output_ids)
                    if fin is not None:
                        self.finish(req, fin.finish_reason, fin.stop_reason)   # blocks freed now
                        finished.append(req.request_id)
                        toks = toks[:j + 1]
                        break
            results.append(StepOutput(req.request_id, toks, fin is not None, fin and fin.finish_reason))
        return results, finished

    def abort(self, req: Request) -> None:
        """Take a waiting or running request out (a client went away): its blocks are free now,
        and the runner hears of it through the next step's ``finished_ids``."""
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.WAITING:
            self.waiting.remove(req)
        else:
            return
        self.kv.free(req.kv)
        req.status, req.finish_reason, req.finished_time = RequestStatus.FINISHED, "abort", time.monotonic()
        self.finished_ids.append(req.request_id)

    def finish(self, req: Request, finish_reason: str, stop_reason=None) -> None:
        """A stop condition fired: free the blocks now, in the same step (the request may be waiting:
        preempted after the step that sampled its last token)."""
        (self.running if req.status == RequestStatus.RUNNING else self.waiting).remove(req)
        self.kv.free(req.kv)
        req.status, req.finish_reason, req.stop_reason = RequestStatus.FINISHED, finish_reason, stop_reason
        req.finished_time = time.monotonic()
        self.finished_ids.append(req.request_id)
