"""Stage 6's engine (prefix caching on by default) with stage 7's runner and host fast path.

What a step computes does not change: the scheduler, the sampler and the stop checks decide as
in stages 4-6. Two things are new above the runner:

* the host fast path (host.py): a steady decode step is scheduled and advanced in one pass, a
  batch of plain greedy rows samples with one argmax, and a request's StopChecker runs only on a
  token that could stop it;
* the engine tells the runner when a request's block-table row can be reused (it finished, or
  it was preempted and will come back with new blocks).

With ``profile=True`` it times each step: wall time, the time the host waited for the GPU, the
rest (host work), and the host parts: schedule, inputs (the runner's one pass over the requests
and the copy), sample (the sampler and the stop checks).
"""
from __future__ import annotations

import time

from l5_scheduler.outputs import StepOutput
from l5_scheduler.scheduler import Scheduler
from l6_prefix_cache.engine import LLMEngine as Stage6Engine

from .host import SteadyPrefixCachingScheduler, SteadyScheduler, attach_stop_facts
from .runner import FastRunner


class LLMEngine(Stage6Engine):
    prefix_scheduler_cls = SteadyPrefixCachingScheduler
    plain_scheduler_cls = SteadyScheduler

    def __init__(self, model, tokenizer, config, *, enforce_eager: bool = False, fused_ops: bool = True,
                 split_kv: bool = True, host_fast_path: bool = True, profile: bool = False, **kw):
        self.fast = dict(enforce_eager=enforce_eager, fused_ops=fused_ops, split_kv=split_kv,
                         host_fast_path=host_fast_path)
        self.host_fast_path = host_fast_path
        if not host_fast_path:                       # stage 6's schedulers, stage 5's step loop
            self.prefix_scheduler_cls, self.plain_scheduler_cls = Stage6Engine.prefix_scheduler_cls, Scheduler
        self.profile = profile
        self.timings: list[dict] = []                # profile: per step wall / wait / host ms, mode
        self._not_plain: set[str] = set()            # unfinished requests the sampler needs more than argmax for
        super().__init__(model, tokenizer, config, **kw)
        self.runner.profile = profile
        self._parts: dict[str, float] = {}
        if profile:                                  # time the host parts of a step
            self.scheduler.schedule = self._timed("schedule", self.scheduler.schedule)
            self.runner.prepare = self._timed("inputs", self.runner.prepare)
            self._sample = self._timed("sample", self._sample)
            self.scheduler.advance = self._timed("advance", self.scheduler.advance)
            self._stats = self._timed("stats", self._stats)

    def _timed(self, name, fn):
        def timed(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            self._parts[name] = self._parts.get(name, 0.0) + time.perf_counter() - t
            return r
        return timed

    def make_runner(self, **kw) -> FastRunner:
        return FastRunner(self.model, self.config, **kw, **self.fast)

    def make_request(self, prompt, params=None, request_id=None):
        req = super().make_request(prompt, params, request_id)
        attach_stop_facts(req, self.model.cfg.eos_token_ids, self.config.max_model_len)
        return req

    def add(self, req) -> str:
        rid = super().add(req)
        if not req.plain_greedy:
            self._not_plain.add(rid)                 # while it is unfinished, check every batch's rows
        return rid

    def _count_tokens(self, s, out) -> None:
        if not self.host_fast_path or any(out.prefill):    # chunks to list: stage 5's loop
            return super()._count_tokens(s, out)
        s.decode_tokens = out.num_tokens
        s.kv_tokens = sum([req.kv.cur_len for req, _ in out.scheduled])

    def _argmax_ids(self, logits) -> list[int]:
        """Stage 4's pipeline for rows that are greedy with no penalties, no min_tokens and no
        logprobs: every step before the argmax is a no-op for them. logits [S, V] -> S ids (the sync).
        A CUDA-graph replay has computed the argmax already (``runner.last_greedy``)."""
        ids = self.runner.last_greedy
        return (logits.argmax(-1) if ids is None else ids).tolist()

    def _sample(self, logits, sampling, stats):
        """Stage 5's loop when any row needs more than an argmax; else the fast loop: one argmax,
        and the StopChecker only for tokens that could stop their request (host.py)."""
        if not self.host_fast_path or self.keep_logits or (self._not_plain and not all(r.plain_greedy for r in sampling)):
            return super()._sample(logits, sampling, stats)
        toks = self._argmax_ids(logits)
        results, done = [], []
        for req, tok in zip(sampling, toks):
            ids = req.output_ids
            ids.append(tok)
            fin = None
            if tok in req.stop_ids or len(ids) >= req.stop_len:
                fin = req.stops.update(ids)
                if fin is not None:
                    done.append((req, fin))
            results.append(StepOutput(req.request_id, [tok], fin is not None, fin and fin.finish_reason))
        for req, fin in done:                        # in batch order, as stage 5 finishes them
            self.scheduler.finish(req, fin.finish_reason, fin.stop_reason)   # blocks freed now
            stats.finished.append(req.request_id)
        return results

    def step(self):
        if not self.profile:
            results = super().step()
        else:
            self._parts = {}
            t0 = time.perf_counter()
            results = super().step()
            wall = time.perf_counter() - t0
            wait = self.runner.last_wait
            parts = {f"{k}_ms": v * 1e3 for k, v in self._parts.items()}
            self.timings.append(dict(wall_ms=wall * 1e3, wait_ms=wait * 1e3, host_ms=(wall - wait) * 1e3,
                                     mode=self.runner.last_mode, tokens=self.stats[-1].prefill_tokens
                                     + self.stats[-1].decode_tokens, **parts))
        st = self.stats[-1]
        for rid in st.preempted + st.finished:
            self.runner.release(rid)
        for rid in st.finished:
            self._not_plain.discard(rid)
        return results
