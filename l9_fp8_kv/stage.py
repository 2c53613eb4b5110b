"""Stage 9's contribution to the assembler: one option and one part.

    slot        part                                           options it reads
    kv_cache    Fp8KVCache (cache.py): e4m3 codes + scales,    kv_cache_dtype (auto: an earlier
                for any KV cache groups, written by its own    stage's cache, the model's dtype)
                fused kernel, read by stage 9's kernels

The memory is what the model-dtype cache would get, cut into e4m3 blocks: twice as many blocks
in bfloat16 (per tensor), 1.94x per token-head at D = 128 (scales take 4 of every D + 4 bytes),
four times in float32. ``num_gpu_blocks_override`` still counts model-dtype blocks of every
layer, so "the same memory" holds across stages; ``llm.llm_engine.scheduler.kv.num_blocks`` is
the pool this stage runs. Every other part (the KV manager, the ops, the runner) is an earlier
stage's: the fused ops hand the K/V write to the cache (``rope_attend``).
"""
from __future__ import annotations

import dataclasses

import torch

from plumbing.errors import UserError
from plumbing.runtime import INTERPRET

from l5_scheduler.assemble import Stage
from l5_scheduler.llm import entry_points
from l8_sliding_window.groups import pool_blocks
from l8_sliding_window.stage import STAGES as BEFORE

from .cache import Fp8KVCache, fp8_pool_blocks
from .e4m3 import e4m3_refusal
from .options import KV_CACHE_DTYPES, OPTIONS


def kv_cache(a):
    """Fp8KVCache: e4m3 codes and scales, any groups, its own fused write (kv_cache_dtype)."""
    per_token = KV_CACHE_DTYPES[a.args.kv_cache_dtype]
    if per_token is None:                             # auto: the model's dtype
        return None
    cfg, groups, p = a.model.cfg, a.part("kv_groups"), next(a.model.parameters())
    why = e4m3_refusal(p.device.type, torch.cuda.get_device_capability(p.device) if p.device.type == "cuda" else None,
                       INTERPRET) if a.args.impl != "torch" else None
    if why:
        raise UserError(f"kv_cache_dtype={a.args.kv_cache_dtype!r}: {why}. Use kv_cache_dtype='auto' on this GPU.")
    shared = pool_blocks(a.config.num_blocks, groups, cfg.num_layers)
    a.config = dataclasses.replace(a.config, num_blocks=fp8_pool_blocks(shared, cfg, groups, a.config.block_size,
                                                                        p.dtype, per_token))
    return Fp8KVCache(cfg, groups, a.config.num_blocks, a.config.block_size, p.device, p.dtype, impl=a.args.impl,
                      per_token=per_token)


STAGES = BEFORE + (Stage("l9_fp8_kv", OPTIONS, dict(kv_cache=kv_cache)),)
LLM, build_engine = entry_points(STAGES)
