"""Async scheduling (vLLM's ``async_scheduling``): stage 5's step, in another order, so the host's
part of a step hides behind the GPU's.

Stage 5's order (l5_scheduler/step.py) waits for step n's tokens before it schedules step n+1.
This order schedules and launches step n+1 first:

    host   schedule n+1 | prepare n+1, launch | wait for n's tokens | append, stop checks | sample n+1 ...
    GPU    ...step n ...|          step n+1 ..............................................|

Three things make that possible:
    counted      at the launch of step n's sampler, each request's next token is counted in
                 ``num_tokens`` before its value exists, so step n+1's scheduler gives it its one
                 decode token. A token that will be its request's last by length is not counted:
                 the scheduler then has nothing to compute for it and leaves it out.
    in flight    the token's value is still on the device: the runner puts a 0 in its place and
                 copies the real one in on the device (``FastRunner.in_flight``, runner.py).
    one wasted   a request that step n's token stops (EOS, a stop string) has already been given
                 step n+1's token: its row is computed and dropped.

Step n's tokens then join their requests through the one path, ``update_from_output``, as in
stage 5; a request aborted while its token was sampled takes nothing.
"""
from __future__ import annotations

import dataclasses

import torch

from l4_sampler.sampler import to_device
from l5_scheduler.outputs import ModelRunnerOutput
from l5_scheduler.request import RequestStatus
from l5_scheduler.step import take_prompt_logprobs

RUNNING, FINISHED = RequestStatus.RUNNING, RequestStatus.FINISHED


class OverlappedStep:
    def __init__(self, runner):
        self.runner = runner            # the eager FastRunner: its in_flight map is filled here
        self.pending = None             # the sampler call in flight: (requests, Sampled, logits, counted)

    def __call__(self, engine):
        sched, pend = engine.scheduler, self.pending
        out = sched.schedule()                               # step n+1, the GPU still on step n
        if not out.scheduled:                                # the rest are finishing: the runner hears
            if pend is None:                                 # of those that finished with the next step
                raise RuntimeError("the scheduler scheduled nothing with requests waiting: this is a bug")
            sched.finished_ids[:0] = out.finished_ids
        ran = engine.runner.execute(out) if out.scheduled else None   # launched: the GPU runs while...
        results, finished = self.take(engine, pend) if pend is not None else ([], [])   # ...the host takes n's
        running, waiting = len(sched.running), len(sched.waiting)
        live = []
        if ran is not None:
            engine.last_meta = ran.meta
            take_prompt_logprobs(out, ran)
            kept = [(req, n) for req, n in out.scheduled if req.status == RUNNING]   # a stopped one's K/V: dropped
            sched.advance(dataclasses.replace(out, scheduled=kept))   # (the cache hashes blocks: tokens known now)
            sampling = [req for (req, _), s in zip(out.scheduled, out.sample) if s]
            live = [req for req in sampling if req.status == RUNNING]
            if live:
                self.launch(engine, ran, sampling, live)
            engine.record(out, running, waiting, len(live), finished)
        return results

    def take(self, engine, pend):
        """Step n's tokens: wait for them, then the one output path."""
        reqs, sampled, logits, counted = pend
        so = sampled.result()                                # the host's one wait
        self.pending = None                                  # (interrupted before here: still in flight)
        keep = []
        for k, (req, c) in enumerate(zip(reqs, counted)):
            self.runner.in_flight.pop(req.request_id, None)
            if req.status == FINISHED:                       # aborted while its token was sampled
                continue
            if c:
                req.num_tokens -= 1                          # counted at launch: update_from_output counts it
            keep.append(k)
        lps = so.logprobs
        return engine.scheduler.update_from_output(ModelRunnerOutput(
            [reqs[k] for k in keep], [[so.token_ids_list[k]] for k in keep],
            [[lps[k]] for k in keep] if lps else None,
            [[logits[k].cpu()] for k in keep] if logits is not None else None))

    @staticmethod
    def counts(req) -> bool:
        """Does the next step compute ``req``'s token now in flight? Not if it is its last by length:
        left uncounted, it leaves the scheduler nothing to give the request."""
        return req.num_tokens + 1 < req.stops.max_len

    def launch(self, engine, ran, sampling, live) -> None:
        """Step n+1's sampler, launched without waiting; its tokens counted (see the module's doc)."""
        logits, argmax = ran.logits, ran.argmax
        if len(live) < len(sampling):                        # a row whose request just stopped: dropped
            idx = to_device([k for k, req in enumerate(sampling) if req.status == RUNNING], torch.int64,
                            logits.device)                   # (pinned: no wait for the GPU)
            logits, argmax = logits[idx], None if argmax is None else argmax[idx]
        sampled = engine.sampler.launch(logits, [req.row for req in live], argmax)
        counted = []
        for k, req in enumerate(live):
            c = self.counts(req)
            if c:
                req.num_tokens += 1
                self.runner.in_flight[req.request_id] = (sampled.ids, k)
            counted.append(c)
        self.pending = (live, sampled, logits.clone() if engine.keep_logits else None, counted)   # (a graph's
                                                             # logits are overwritten by the next replay)
