"""``LLM`` with sliding windows: stage 7's engine, given two parts that know the window.

    from l8_sliding_window import LLM, SamplingParams
    llm = LLM("tiny-mistral")                          # every layer windowed: blocks are freed
    llm = LLM("tiny-qwen2-hybrid")                     # windowed + full layers: history kept

    kv     SlidingWindowKVManager (kv_manager.py)   stage 6's prefix cache + frees dead blocks
    cache  WindowedKVCache (cache.py)               a windowed layer attends with attention.py

A checkpoint without windows runs exactly as stage 7 (no layer windowed, nothing freed). With
``enable_prefix_caching=False`` the KV manager is stage 5's allocator: the windows are honoured,
but no block is freed before its request finishes.
"""
from __future__ import annotations

from l5_scheduler import llm as stage5
from l7_fast import llm as stage7

from .cache import WindowedKVCache
from .kv_manager import SlidingWindowKVManager


def free_window(layer_windows) -> int | None:
    """The window the KV manager may free by: the widest, if every layer has one; else None."""
    if not layer_windows or any(w is None for w in layer_windows):
        return None
    return max(layer_windows)


def build_engine(model, tokenizer, config, *, enable_prefix_caching: bool = True, impl: str = "triton", **kw):
    """Stage 7's builder with this stage's KV manager and KV cache."""
    p = next(model.parameters())
    cache = WindowedKVCache(model.cfg, config.num_blocks, config.block_size, p.device, p.dtype, impl=impl)
    kv = None
    if enable_prefix_caching:
        kv = SlidingWindowKVManager(config.num_blocks, config.block_size, free_window(model.cfg.layer_windows))
    return stage7.build_engine(model, tokenizer, config, enable_prefix_caching=enable_prefix_caching, kv=kv,
                               cache=cache, impl=impl, **kw)


def LLM(model: str | None = None, **kw) -> stage5.LLM:
    """``l5_scheduler.LLM`` built by this stage's ``build_engine``; every stage 5-7 argument works."""
    return stage5.LLM(model, build_engine=build_engine, **kw)
