"""Stage 6: prefix caching. A full KV block is named by the hash of its tokens and of every
token before it; a new request takes the cached blocks of its longest matching prefix (one
reference each) and computes only the rest. Freed blocks keep their hashes in an LRU free
queue until they are evicted.

One part is new: the KV manager (``KVCacheManager``), given to stage 5's scheduler and engine
loop in place of stage 2's allocator (``build_engine``)."""
import plumbing.runtime  # noqa: F401  (first: sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
from l4_sampler.params import SamplingParams

from .block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from .hashing import block_hashes, hash_block, longest_cached_prefix
from .kv_manager import CacheStats, KVCacheManager
from .llm import LLM, build_engine

__all__ = ["LLM", "build_engine", "SamplingParams", "BlockPool", "FreeKVCacheBlockQueue", "KVCacheBlock",
           "KVCacheManager", "CacheStats", "block_hashes", "hash_block", "longest_cached_prefix"]
