"""Stage 6's engine (prefix caching on by default) with stage 7's runner.

Nothing above the runner changes: the scheduler, the sampler and the stop checks are stage 5's
and 6's. The engine only tells the runner when a request's block-table row can be reused (it
finished, or it was preempted and will come back with new blocks), and, with ``profile=True``,
times each step: wall time, the time the host waited for the GPU, the rest (host work), and the
host parts: schedule, inputs (the runner's one pass over the requests and the copy), sample.
"""
from __future__ import annotations

import time

from l6_prefix_cache.engine import LLMEngine as Stage6Engine

from .runner import FastRunner


class LLMEngine(Stage6Engine):
    def __init__(self, model, tokenizer, config, *, enforce_eager: bool = False, fused_ops: bool = True,
                 split_kv: bool = True, profile: bool = False, **kw):
        self.fast = dict(enforce_eager=enforce_eager, fused_ops=fused_ops, split_kv=split_kv)
        self.profile = profile
        self.timings: list[dict] = []                # profile: per step wall / wait / host ms, mode
        super().__init__(model, tokenizer, config, **kw)
        self.runner.profile = profile
        self._parts: dict[str, float] = {}
        if profile:                                  # time the host parts of a step
            self.scheduler.schedule = self._timed("schedule", self.scheduler.schedule)
            self.runner.prepare = self._timed("inputs", self.runner.prepare)
            sampler = self.sampler
            self.sampler = self._timed("sample", lambda logits, rows: sampler(logits, rows))

    def _timed(self, name, fn):
        def timed(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            self._parts[name] = self._parts.get(name, 0.0) + time.perf_counter() - t
            return r
        return timed

    def make_runner(self, **kw) -> FastRunner:
        return FastRunner(self.model, self.config, **kw, **self.fast)

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
        return results
