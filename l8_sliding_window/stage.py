"""Stage 8's contribution to the assembler: parts that know the windows, and no option (the
checkpoint says which layers are windowed).

    slot        part                                                   when
    kv_groups   kv_cache_groups (groups.py): layers that share a        always
                block table, full-attention kinds first
    kv_cache    WindowedKVCache (cache.py): groups share tensors;       the checkpoint has windows
                windowed layers run this stage's kernels
    kv_manager  KVCacheCoordinator (kv_coordinator.py): one manager     the checkpoint has windows
                per group, full or sliding window, one pool
    inputs      GroupInputs (inputs.py): a block table per group         more than one group

A checkpoint without windows is one full-attention group: every maker here returns None and
the engine is stage 7's exactly.

``num_gpu_blocks_override`` and the memory-derived pool count blocks of *every* layer, as in
stage 7; with G groups of g layers each the same memory holds num_layers / g times as many blocks
of one group (``llm.llm_engine.scheduler.kv.num_blocks``).
"""
from __future__ import annotations

import dataclasses

from l5_scheduler.assemble import Stage
from l5_scheduler.llm import entry_points
from l7_fast.stage import STAGES as BEFORE

from .cache import WindowedKVCache
from .groups import kv_cache_groups, pool_blocks
from .inputs import GroupInputs
from .kv_coordinator import KVCacheCoordinator
from .options import OPTIONS


def windowed(a) -> bool:
    groups = a.part("kv_groups")
    return len(groups) > 1 or groups[0].window is not None


def kv_groups(a):
    """kv_cache_groups: layers that share a block table, full-attention kinds first."""
    return kv_cache_groups(a.model.cfg.layer_windows, a.model.cfg.num_layers)


def kv_cache(a):
    """WindowedKVCache: groups share tensors; windowed layers read only their window."""
    if not windowed(a):
        return None
    cfg, groups, p = a.model.cfg, a.part("kv_groups"), next(a.model.parameters())
    a.config = dataclasses.replace(a.config, num_blocks=pool_blocks(a.config.num_blocks, groups, cfg.num_layers))
    return WindowedKVCache(cfg, groups, a.config.num_blocks, a.config.block_size, p.device, p.dtype, impl=a.args.impl)


def kv_manager(a):
    """KVCacheCoordinator: a full or sliding-window manager per group, one pool (enable_prefix_caching)."""
    if not windowed(a):
        return None
    a.pool()                                          # the cache's layout settles the pool's size first
    return KVCacheCoordinator(a.config.num_blocks, a.config.block_size, [g.window for g in a.part("kv_groups")],
                              enable_caching=a.args.enable_prefix_caching)


def inputs(a):
    """GroupInputs: stage 7's inputs, a block table and slots per KV cache group."""
    groups = a.part("kv_groups")
    if len(groups) == 1:
        return None
    cache = a.part("kv_cache")
    return GroupInputs(a.config, a.device, cache.pad_block, cache.pad_slot, len(groups))


STAGES = BEFORE + (Stage("l8_sliding_window", OPTIONS, dict(kv_groups=kv_groups, kv_cache=kv_cache,
                                                             kv_manager=kv_manager, inputs=inputs)),)
LLM, build_engine = entry_points(STAGES)
