"""The option stage 9 adds (declared once, here; plumbing/options.py)."""
from plumbing.options import Option
from l8_sliding_window.options import ENGINE_OPTIONS as BEFORE

KV_CACHE_DTYPES = {"auto": None, "fp8": False, "fp8_e4m3": False, "fp8_per_token_head": True}   # -> per token-head?

OPTIONS = (
    Option("kv_cache_dtype", "auto", "the KV cache's storage: auto (the model's dtype), fp8 / fp8_e4m3 (e4m3 with "
           "vLLM's per-tensor scale 1.0), fp8_per_token_head (e4m3, a scale per token and head)", "cache", "kv_cache",
           choices=tuple(KV_CACHE_DTYPES)),
)

ENGINE_OPTIONS = BEFORE + OPTIONS            # the options of the engine up to this stage
