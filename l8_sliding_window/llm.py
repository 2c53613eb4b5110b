"""``LLM`` with sliding windows: stage 7's engine, given three parts that know the windows.

    from l8_sliding_window import LLM, SamplingParams
    llm = LLM("tiny-mistral")                          # every layer windowed: one group, blocks freed
    llm = LLM("tiny-qwen2-hybrid")                     # full + windowed layers: three groups

    groups  kv_cache_groups (groups.py)             layers that share a block table
    kv      SlidingWindowKVManager (kv_manager.py)  stage 6's prefix cache per group + frees dead blocks
    cache   WindowedKVCache (cache.py)              groups share tensors; windowed layers: attention.py
    runner  GroupedRunner (runner.py)               stage 7's runner, one block table per group

A checkpoint without windows is one full-attention group: exactly stage 7. With
``enable_prefix_caching=False`` the KV manager looks nothing up and hashes nothing, but still
frees the blocks that fall out of a window.

``num_gpu_blocks_override`` and the memory-derived pool count blocks of *every* layer, as in
stage 7; with G groups of g layers each the same memory holds num_layers / g times as many blocks
of one group (``llm.llm_engine.scheduler.kv.num_blocks``).
"""
from __future__ import annotations

import dataclasses

from l5_scheduler import llm as stage5
from plumbing.errors import UserError
from l7_fast import llm as stage7

from .cache import WindowedKVCache
from .groups import kv_cache_groups, pool_blocks
from .kv_manager import SlidingWindowKVManager
from .runner import GroupedRunner


def check_fits(config, groups) -> None:
    """A request of max_model_len tokens must fit the pool alone, at its largest: every block in a
    full group, the window's bound in a windowed one (else the scheduler could never run it)."""
    bs, L = config.block_size, config.max_model_len
    full = -(-L // bs)
    need = sum(full if g.window is None else min(full, -(-(g.window + config.max_num_batched_tokens - 1) // bs) + 1)
               for g in groups)
    if need > config.num_blocks:
        raise UserError(f"one request of max_model_len = {L} tokens needs up to {need} blocks across its {len(groups)} "
                        f"KV cache groups, but the pool has {config.num_blocks}: raise num_gpu_blocks_override or "
                        "lower max_model_len (or max_num_batched_tokens, which bounds a windowed group's chunk).")


def build_engine(model, tokenizer, config, *, enable_prefix_caching: bool = True, impl: str = "triton",
                 check: bool = False, fused_ops: bool = True, split_kv: bool = True, gemv: bool = True,
                 norm_prologue: bool = True, pdl: bool = True, enforce_eager: bool = False, profiler=None, **kw):
    """Stage 7's builder with this stage's KV manager, KV cache and runner (stage 7's ops, built
    here with stage 7's options)."""
    cfg, p = model.cfg, next(model.parameters())
    groups = kv_cache_groups(cfg.layer_windows, cfg.num_layers)
    config = dataclasses.replace(config, num_blocks=pool_blocks(config.num_blocks, groups, cfg.num_layers))
    check_fits(config, groups)
    cache = WindowedKVCache(cfg, groups, config.num_blocks, config.block_size, p.device, p.dtype, impl=impl)
    kv = SlidingWindowKVManager(config.num_blocks, config.block_size, [g.window for g in groups],
                                caching=enable_prefix_caching)
    runner = GroupedRunner(model, config, stage7.make_ops(model, fused_ops=fused_ops, gemv=gemv,
                                                           norm_prologue=norm_prologue, pdl=pdl), impl=impl,
                           check=check, split_kv=split_kv, cache=cache, num_groups=len(groups))
    return stage7.build_engine(model, tokenizer, config, enable_prefix_caching=enable_prefix_caching, kv=kv,
                               runner=runner, impl=impl, check=check, enforce_eager=enforce_eager, profiler=profiler,
                               **kw)


def LLM(model: str | None = None, **kw) -> stage5.LLM:
    """``l5_scheduler.LLM`` built by this stage's ``build_engine``; every stage 5-7 argument works."""
    return stage5.LLM(model, build_engine=build_engine, **kw)
