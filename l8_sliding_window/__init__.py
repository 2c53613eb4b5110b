"""Stage 8: sliding-window attention. A windowed layer's query at position p sees keys p - W < j <= p;
the kernels walk only those, and the KV manager frees the blocks no layer will read again.

    from l8_sliding_window import LLM, SamplingParams
    llm = LLM("tiny-mistral")                          # every layer windowed: one group, blocks freed
    llm = LLM("tiny-qwen2-hybrid")                     # full + windowed layers: three groups
"""
from plumbing.lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, {
    'l4_sampler.params': ('SamplingParams',),
    '.stage': ('LLM', 'build_engine', 'STAGES'),
    '.attention': ('paged_attention_window', 'window_attention_ref', 'window_keys'),
    '.cache': ('WindowedKVCache',),
    '.group_managers': ('FullAttentionManager', 'SlidingWindowManager', 'dead_blocks'),
    '.groups': ('KVGroup', 'kv_cache_groups'),
    '.inputs': ('GroupInputs', 'GroupMeta'),
    '.kv_coordinator': ('KVCacheCoordinator',),
})
