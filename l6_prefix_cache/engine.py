"""Stage 5's engine with the prefix-caching scheduler (``enable_prefix_caching=False``: stage 5's).

The runner, the sampler and the stop checks are untouched: a prefix hit only means the first
chunk of a request starts at ``num_computed_tokens = hit`` instead of 0, and ``build_meta``
already describes a chunk that starts anywhere (its positions, slots and ``seq_lens_kv`` come
from ``cur_len``). The step's trace line gains what the cache did.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from l5_scheduler.engine import LLMEngine as Stage5Engine
from l5_scheduler.outputs import StepStats as Stage5Stats
from l5_scheduler.scheduler import Scheduler

from .scheduler import PrefixCachingScheduler


@dataclass
class StepStats(Stage5Stats):
    hits: list[tuple[str, int]] = field(default_factory=list)   # (id, cached tokens) per admission
    blocks_cached: int = 0                                       # blocks with a hash, held or free

    def line(self) -> str:
        s = super().line()
        hits = [(r, n) for r, n in self.hits if n]
        if hits:
            s = s.replace(" | running", " | hit " + ",".join(f"{r}+{n}" for r, n in hits) + " | running", 1)
        return s + f" | cached {self.blocks_cached}"


class LLMEngine(Stage5Engine):
    prefix_scheduler_cls = PrefixCachingScheduler    # caching on; off: stage 5's (stage 7 swaps both)
    plain_scheduler_cls = Scheduler

    def __init__(self, model, tokenizer, config, *, enable_prefix_caching: bool = True, **kw):
        self.enable_prefix_caching = enable_prefix_caching
        self.scheduler_cls = self.prefix_scheduler_cls if enable_prefix_caching else self.plain_scheduler_cls
        super().__init__(model, tokenizer, config, **kw)

    def _stats(self, out):
        s = super()._stats(out)
        if not self.enable_prefix_caching:
            return s
        sched = self.scheduler
        return StepStats(**vars(s), hits=list(sched.hits.items()), blocks_cached=len(sched.alloc.pool.cached))
