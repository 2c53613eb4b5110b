"""Engine limits: the KV pool's size, the token budget, the running cap and the context.

Defaults, with vLLM's names:

    block_size              16
    num_gpu_blocks_override None -> CUDA: what fits in free memory (below); CPU: 256 blocks
    max_num_batched_tokens  None -> 8192 tokens per step
    max_num_seqs            None -> min(256, max_num_batched_tokens)
    max_model_len           None -> the model's context, capped at what the pool holds

On CUDA the pool takes what the loaded model leaves, keeping (1 - gpu_memory_utilization) of
the card free and an estimate of one step's activations:

    kv_bytes  = free_after_load - (1 - utilization) * total - activations
    activations ~ max_num_batched_tokens * (3 * intermediate + 6 * hidden + (H_q + 2 H_kv) * D) * elt
                + max_num_seqs * vocab * 4 B * 4     (fp32 logits and the sampler's copies)
    num_blocks = kv_bytes // bytes_per_block
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from plumbing.cli import positive_or_none
from plumbing.errors import UserError

CPU_NUM_BLOCKS = 256


@dataclass(frozen=True)
class EngineConfig:
    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int

    @property
    def capacity(self) -> int:
        return self.num_blocks * self.block_size


def _positive(name: str, value, default):
    v = positive_or_none(name, value)
    return default if v is None else v


def bytes_per_block(cfg, block_size: int, dtype: torch.dtype) -> int:
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize


def cuda_num_blocks(cfg, dtype, block_size, max_num_batched_tokens, max_num_seqs, utilization) -> int:
    free, total = torch.cuda.mem_get_info()
    acts = max_num_batched_tokens * (3 * cfg.intermediate_size + 6 * cfg.hidden_size
                                     + (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim) * dtype.itemsize
    acts += max_num_seqs * cfg.vocab_size * 4 * 4
    kv_bytes = free - (1 - utilization) * total - acts
    n = int(kv_bytes // bytes_per_block(cfg, block_size, dtype))
    if n < 1:
        raise UserError(f"no GPU memory left for the KV cache ({free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB "
                        f"after loading the model): raise gpu_memory_utilization ({utilization}), lower "
                        "max_num_batched_tokens, or pass num_gpu_blocks_override")
    return n


def make_config(cfg, device: str, dtype: torch.dtype, *, block_size=16, num_gpu_blocks_override=None,
                max_num_batched_tokens=None, max_num_seqs=None, max_model_len=None,
                gpu_memory_utilization=0.9) -> EngineConfig:
    block_size = _positive("block_size", block_size, 16)
    budget = _positive("max_num_batched_tokens", max_num_batched_tokens, 8192)
    seqs = _positive("max_num_seqs", max_num_seqs, min(256, budget))
    if seqs > budget:
        raise UserError(f"max_num_seqs ({seqs}) is larger than max_num_batched_tokens ({budget}): every running "
                        "request needs at least one token of the step's budget. Raise the budget or lower max_num_seqs.")
    if not 0 < gpu_memory_utilization <= 1:
        raise UserError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    num_blocks = _positive("num_gpu_blocks_override", num_gpu_blocks_override, None)
    if num_blocks is None:
        num_blocks = (cuda_num_blocks(cfg, dtype, block_size, budget, seqs, gpu_memory_utilization)
                      if str(device).startswith("cuda") else CPU_NUM_BLOCKS)
    capacity = num_blocks * block_size
    context = cfg.max_position_embeddings
    max_len = _positive("max_model_len", max_model_len, min(context, capacity))
    if max_len > context:
        raise UserError(f"max_model_len ({max_len}) exceeds the model's context (max_position_embeddings = {context}): "
                        "lower max_model_len.")
    if max_len > capacity:
        raise UserError(f"max_model_len ({max_len}) exceeds what the KV pool holds ({num_blocks} blocks x {block_size} "
                        f"= {capacity} tokens): raise num_gpu_blocks_override or lower max_model_len.")
    return EngineConfig(block_size, num_blocks, budget, seqs, max_len)
