"""Stage 8: sliding-window attention. A windowed layer's query at position p sees keys p - W < j <= p;
the kernels walk only those, and the KV manager frees the blocks no layer will read again."""
import plumbing.runtime  # noqa: F401  (first: sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
from l4_sampler.params import SamplingParams

from .attention import paged_attention_window, window_attention_ref, window_keys
from .cache import WindowedKVCache
from .groups import KVGroup, kv_cache_groups
from .kv_manager import SlidingWindowKVManager
from .llm import LLM, build_engine
from .runner import GroupedRunner

__all__ = ["LLM", "build_engine", "SamplingParams", "paged_attention_window", "window_attention_ref", "window_keys",
           "WindowedKVCache", "SlidingWindowKVManager", "KVGroup", "kv_cache_groups", "GroupedRunner"]
