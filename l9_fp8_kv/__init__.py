"""Stage 9: an fp8 KV cache. K and V are stored as float8_e4m3fn codes with scales (per tensor, or
per token and head), quantized by the fused write kernel and dequantized inside attention."""
import plumbing.runtime  # noqa: F401  (first: sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
from l4_sampler.params import SamplingParams

from .attention import fp8_attention_ref, paged_attention_fp8
from .attention_split import paged_attention_fp8_split
from .cache import KV_CACHE_DTYPES, Fp8KVCache
from .e4m3 import dequantize_kv, quantize_kv
from .llm import LLM, build_engine
from .ops import Fp8Ops
from .write import rope_write_fp8

__all__ = ["LLM", "build_engine", "SamplingParams", "paged_attention_fp8", "paged_attention_fp8_split",
           "fp8_attention_ref", "Fp8KVCache", "KV_CACHE_DTYPES", "quantize_kv", "dequantize_kv", "Fp8Ops",
           "rope_write_fp8"]
