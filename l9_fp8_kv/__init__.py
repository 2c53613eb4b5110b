"""Stage 9: an fp8 KV cache. K and V are stored as float8_e4m3fn codes with scales (per tensor, or
per token and head), quantized by the fused write kernel and dequantized inside attention.

    from l9_fp8_kv import LLM, SamplingParams
    llm = LLM("tiny-qwen3", kv_cache_dtype="fp8")                  # vLLM's per-tensor scale (1.0)
    llm = LLM("tiny-qwen3", kv_cache_dtype="fp8_per_token_head")   # a scale per token and head
    llm = LLM("tiny-qwen3")                                        # "auto": the model's dtype, stage 8 exactly
"""
from plumbing.lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, {
    'l4_sampler.params': ('SamplingParams',),
    '.stage': ('LLM', 'build_engine', 'STAGES'),
    '.attention': ('fp8_attention_ref', 'paged_attention_fp8'),
    '.attention_split': ('paged_attention_fp8_split',),
    '.cache': ('Fp8KVCache',),
    '.e4m3': ('dequantize_kv', 'quantize_kv'),
    '.options': ('KV_CACHE_DTYPES',),
    '.write': ('rope_write_fp8',),
})
