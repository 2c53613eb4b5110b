"""``LLM`` with an fp8 KV cache: stage 8's engine, given a cache that stores e4m3 and the ops that
quantize into it.

    from l9_fp8_kv import LLM, SamplingParams
    llm = LLM("tiny-qwen3", kv_cache_dtype="fp8")                  # vLLM's per-tensor scale (1.0)
    llm = LLM("tiny-qwen3", kv_cache_dtype="fp8_per_token_head")   # a scale per token and head
    llm = LLM("tiny-qwen3")                                        # "auto": the model's dtype, stage 8 exactly

    groups  kv_cache_groups (stage 8)           layers that share a block table
    kv      SlidingWindowKVManager (stage 8)    prefix cache per group, frees blocks out of the window
    cache   Fp8KVCache (cache.py)               e4m3 codes + scales; stage 9's attention kernels
    ops     Fp8Ops (ops.py)                     stage 7's fused ops, the K/V write quantizing
    runner  GroupedRunner (stage 8)             one block table per group

The memory is what stage 8 would give the model-dtype cache, cut into e4m3 blocks: twice as many
blocks in bfloat16 (per tensor), 1.94x per token-head at D = 128 (scales take 4 of every D + 4
bytes), four times in float32. ``num_gpu_blocks_override`` still counts model-dtype blocks of every
layer, so "the same memory" holds across stages; ``llm.llm_engine.scheduler.kv.num_blocks`` is
the pool this stage runs.
"""
from __future__ import annotations

import dataclasses

from l1_dense.model import TorchOps
from l5_scheduler import llm as stage5
from plumbing.errors import UserError
from l7_fast import llm as stage7
from l7_fast.gemv import GEMV_MAX_M
from l8_sliding_window import llm as stage8
from l8_sliding_window.groups import kv_cache_groups, pool_blocks
from l8_sliding_window.kv_manager import SlidingWindowKVManager
from l8_sliding_window.runner import GroupedRunner

from .cache import KV_CACHE_DTYPES, Fp8KVCache, fp8_pool_blocks
from .ops import Fp8Ops


def build_engine(model, tokenizer, config, *, kv_cache_dtype: str = "auto", enable_prefix_caching: bool = True,
                 impl: str = "triton", check: bool = False, fused_ops: bool = True, split_kv: bool = True,
                 gemv: bool = True, norm_prologue: bool = True, pdl: bool = True, enforce_eager: bool = False,
                 profiler=None, **kw):
    """``kv_cache_dtype="auto"``: stage 8's builder, unchanged. An fp8 name: stage 8's parts with
    this stage's cache and ops."""
    common = dict(enable_prefix_caching=enable_prefix_caching, impl=impl, check=check, split_kv=split_kv,
                  enforce_eager=enforce_eager, profiler=profiler, **kw)
    if kv_cache_dtype == "auto":
        return stage8.build_engine(model, tokenizer, config, fused_ops=fused_ops, gemv=gemv,
                                   norm_prologue=norm_prologue, pdl=pdl, **common)
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise UserError(f"kv_cache_dtype {kv_cache_dtype!r} unsupported: use 'auto' (the model's dtype), 'fp8' "
                        "(= 'fp8_e4m3', vLLM's per-tensor scale) or 'fp8_per_token_head' (a scale per token and head)")
    per_token = KV_CACHE_DTYPES[kv_cache_dtype]
    cfg, p = model.cfg, next(model.parameters())
    groups = kv_cache_groups(cfg.layer_windows, cfg.num_layers)
    shared = pool_blocks(config.num_blocks, groups, cfg.num_layers)
    config = dataclasses.replace(config, num_blocks=fp8_pool_blocks(shared, cfg, groups, config.block_size,
                                                                    p.dtype, per_token))
    stage8.check_fits(config, groups)
    cache = Fp8KVCache(cfg, groups, config.num_blocks, config.block_size, p.device, p.dtype, impl=impl,
                       per_token=per_token)
    kv = SlidingWindowKVManager(config.num_blocks, config.block_size, [g.window for g in groups],
                                caching=enable_prefix_caching)
    ops = Fp8Ops(model, gemv_max_m=GEMV_MAX_M if gemv else 0, norm_prologue=norm_prologue, pdl=pdl) \
        if fused_ops else TorchOps()                                                  # stage 7's make_ops
    runner = GroupedRunner(model, config, ops, impl=impl, check=check, split_kv=split_kv, cache=cache,
                           num_groups=len(groups))
    return stage7.build_engine(model, tokenizer, config, kv=kv, runner=runner, **common)


def LLM(model: str | None = None, **kw) -> stage5.LLM:
    """``l5_scheduler.LLM`` built by this stage's ``build_engine``; every stage 5-8 argument works."""
    return stage5.LLM(model, build_engine=build_engine, **kw)
