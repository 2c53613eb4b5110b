"""``LLM`` with prefix caching, on by default as in vLLM v1: stage 5's ``LLM`` and engine loop,
given one other part, the prefix-caching KV manager.

    from l6_prefix_cache import LLM, SamplingParams
    llm = LLM(None)                                   # the built-in tiny Qwen3
    llm = LLM(None, enable_prefix_caching=False)      # exactly stage 5 (stage 2's allocator)
    llm.llm_engine.scheduler.kv.stats.hit_rate        # cached tokens / tokens looked up

The runner, the sampler and the stop checks are untouched: a prefix hit only means the first
chunk of a request starts at ``num_computed_tokens = hit`` instead of 0, and ``build_meta``
already describes a chunk that starts anywhere (its positions, slots and ``seq_lens_kv`` come
from ``cur_len``).
"""
from __future__ import annotations

from l5_scheduler import llm as stage5

from .kv_manager import KVCacheManager


def build_engine(model, tokenizer, config, *, enable_prefix_caching: bool = True, kv=None, **kw):
    """Stage 5's builder with the prefix-caching KV manager (off: stage 2's allocator, as in stage 5)."""
    if kv is None and enable_prefix_caching:
        kv = KVCacheManager(config.num_blocks, config.block_size)
    return stage5.build_engine(model, tokenizer, config, kv=kv, **kw)


def LLM(model: str | None = None, **kw) -> stage5.LLM:
    """``l5_scheduler.LLM`` built by this stage's ``build_engine`` (``enable_prefix_caching=True``
    by default); every stage 5 argument works as there."""
    return stage5.LLM(model, build_engine=build_engine, **kw)
