"""Stage 5's contribution to the assembler (assemble.py): its options and its parts.

    slot        part                                   options it reads
    model       the model given, or CausalLM loaded    model, device, dtype (LLM's Checkpoint)
    kv_cache    stage 3's PagedKVCache                 impl, check
    kv_manager  BlockManager (stage 2's allocator)     (the sizes)
    ops         the skeleton's TorchOps                -
    runner      ModelRunner                            impl, check
    sampler     stage 4's Sampler                      seed
    scheduler   Scheduler                              max_num_batched_tokens, max_num_seqs
    step        PlainStep (step.py)                    -
"""
from __future__ import annotations

from l1_dense.checkpoint import load_model
from l1_dense.model import TorchOps
from l3_paged.cache import PagedKVCache
from l4_sampler.sampler import Sampler

from .assemble import Checkpoint, Stage
from .llm import entry_points
from .kv_manager import BlockManager
from .options import OPTIONS
from .runner import ModelRunner
from .scheduler import Scheduler
from .step import PlainStep


def model(a):
    """CausalLM: the model given to the assembler, or loaded whole from its checkpoint (stage 1)."""
    g = a.given
    return load_model(g.path, g.device, g.dtype) if isinstance(g, Checkpoint) else g


def kv_cache(a):
    """PagedKVCache: stage 3's block tensors, its kernel or its reference (impl)."""
    p = next(a.model.parameters())
    return PagedKVCache(a.model.cfg, a.config.num_blocks, a.config.block_size, p.device, p.dtype, impl=a.args.impl,
                        check=a.args.check)


def kv_manager(a):
    """BlockManager: stage 2's allocator and the scheduler's calls."""
    a.pool()                                          # the cache's layout settles the pool's size first
    return BlockManager(a.config.num_blocks, a.config.block_size)


def ops(a):
    """TorchOps: the skeleton's small ops in plain torch (stage 1)."""
    return TorchOps()


def runner(a):
    """ModelRunner: stage 3's metadata per step, one forward pass."""
    return ModelRunner(a.model, a.config, impl=a.args.impl, check=a.args.check, ops=a.part("ops"),
                       cache=a.part("kv_cache"))


def sampler(a):
    """Sampler: stage 4's, seeded by seed."""
    return Sampler(a.args.seed)


def scheduler(a):
    """Scheduler: one token budget, chunked prefill, preemption by recompute."""
    return Scheduler(a.part("kv_manager"), a.config.max_num_batched_tokens, a.config.max_num_seqs)


def step(a):
    """PlainStep: each step waits for its own tokens."""
    return PlainStep()


STAGES = (Stage("l5_scheduler", OPTIONS, dict(model=model, kv_cache=kv_cache, kv_manager=kv_manager, ops=ops,
                                              runner=runner, sampler=sampler, scheduler=scheduler, step=step)),)
LLM, build_engine = entry_points(STAGES)
