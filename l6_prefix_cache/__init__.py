"""Stage 6: prefix caching. A full KV block is named by the hash of its tokens and of every
token before it; a new request takes the cached blocks of its longest matching prefix (one
reference each) and computes only the rest. Freed blocks keep their hashes in an LRU free
queue until they are evicted.

One part is new: the KV manager (``KVCacheManager``), which the assembler gives stage 5's
scheduler in place of stage 2's allocator (stage.py); ``enable_prefix_caching=False`` turns the
caching off in the same part.

    from l6_prefix_cache import LLM, SamplingParams
    llm = LLM(None)                                   # the built-in tiny Qwen3, prefix caching on
    llm.llm_engine.scheduler.kv.stats.hit_rate        # cached tokens / tokens looked up
"""
from plumbing.lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, {
    'l4_sampler.params': ('SamplingParams',),
    '.stage': ('LLM', 'build_engine', 'STAGES'),
    '.block_pool': ('BlockPool', 'FreeKVCacheBlockQueue', 'KVCacheBlock'),
    '.hashing': ('block_hashes', 'hash_block', 'longest_cached_prefix'),
    '.kv_manager': ('CacheStats', 'KVCacheManager'),
})
