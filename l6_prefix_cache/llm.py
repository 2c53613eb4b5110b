"""``LLM`` with prefix caching, on by default as in vLLM v1:

    from l6_prefix_cache import LLM, SamplingParams
    llm = LLM(None)                                   # the built-in tiny Qwen3
    llm = LLM(None, enable_prefix_caching=False)      # exactly stage 5
    llm.llm_engine.scheduler.stats.hit_rate           # cached tokens / tokens looked up
"""
from __future__ import annotations

from l5_scheduler.llm import LLM as Stage5LLM

from .engine import LLMEngine


class LLM(Stage5LLM):
    def __init__(self, model: str | None = None, *, enable_prefix_caching: bool = True, **kw):
        self.enable_prefix_caching = enable_prefix_caching
        super().__init__(model, **kw)

    def make_engine(self, config, **kw) -> LLMEngine:
        return LLMEngine(self.model, self.tokenizer, config, enable_prefix_caching=self.enable_prefix_caching, **kw)
