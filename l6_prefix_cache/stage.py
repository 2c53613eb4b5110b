"""Stage 6's contribution to the assembler: one option and one part.

    slot        part                                      options it reads
    kv_manager  KVCacheManager (kv_manager.py)            enable_prefix_caching (the pool's property)

Everything else is stage 5's: the runner, the sampler and the stop checks are untouched. A prefix
hit only means a request's first chunk starts at ``num_computed_tokens = hit`` instead of 0, and
``build_meta`` already describes a chunk that starts anywhere.
"""
from __future__ import annotations

from l5_scheduler.assemble import Stage
from l5_scheduler.llm import entry_points
from l5_scheduler.stage import STAGES as BEFORE

from .kv_manager import KVCacheManager
from .options import OPTIONS


def kv_manager(a):
    """KVCacheManager: full blocks named by a hash chain, shared (enable_prefix_caching: on or off)."""
    a.pool()                                          # the cache's layout settles the pool's size first
    return KVCacheManager(a.config.num_blocks, a.config.block_size, enable_caching=a.args.enable_prefix_caching)


STAGES = BEFORE + (Stage("l6_prefix_cache", OPTIONS, dict(kv_manager=kv_manager)),)
LLM, build_engine = entry_points(STAGES)
