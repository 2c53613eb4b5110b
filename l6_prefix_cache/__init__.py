"""Stage 6: prefix caching. A full KV block is named by the hash of its tokens and of every
token before it; a new request takes the cached blocks of its longest matching prefix (one
reference each) and computes only the rest. Freed blocks keep their hashes in an LRU free
queue until they are evicted."""
import l1_dense  # noqa: F401  (sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
from l4_sampler.params import SamplingParams

from .block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from .engine import LLMEngine
from .hashing import block_hashes, hash_block, longest_cached_prefix
from .kv_manager import KVCacheManager
from .llm import LLM
from .scheduler import CacheStats, PrefixCachingScheduler

__all__ = ["LLM", "LLMEngine", "SamplingParams", "BlockPool", "FreeKVCacheBlockQueue", "KVCacheBlock",
           "KVCacheManager", "PrefixCachingScheduler", "CacheStats", "block_hashes", "hash_block",
           "longest_cached_prefix"]
