"""Stage 5's contribution to the assembler (assemble.py): its options and its parts.

    slot        part                                   options it reads
    kv_cache    stage 3's PagedKVCache                 impl, check
    kv_manager  BlockManager (stage 2's allocator)     (the sizes)
    ops         the skeleton's TorchOps                -
    runner      ModelRunner                            impl, check
    sampler     stage 4's Sampler                      seed
    scheduler   Scheduler                              max_num_batched_tokens, max_num_seqs
    step        PlainStep (step.py)                    -
"""
from __future__ import annotations

from l1_dense.model import TorchOps
from l3_paged.cache import PagedKVCache
from l4_sampler.sampler import Sampler

from .assemble import Stage
from .llm import entry_points
from .kv_manager import BlockManager
from .options import OPTIONS
from .runner import ModelRunner
from .scheduler import Scheduler
from .step import PlainStep


def kv_cache(a):
    p = next(a.model.parameters())
    return PagedKVCache(a.model.cfg, a.config.num_blocks, a.config.block_size, p.device, p.dtype, impl=a.args.impl,
                        check=a.args.check)


def kv_manager(a):
    a.part("kv_cache")                                # the cache's layout settles the pool's size first
    return BlockManager(a.config.num_blocks, a.config.block_size)


def runner(a):
    return ModelRunner(a.model, a.config, impl=a.args.impl, check=a.args.check, ops=a.part("ops"),
                       cache=a.part("kv_cache"))


def scheduler(a):
    return Scheduler(a.part("kv_manager"), a.config.max_num_batched_tokens, a.config.max_num_seqs)


STAGES = (Stage("l5_scheduler", OPTIONS, dict(
    kv_cache=kv_cache, kv_manager=kv_manager, ops=lambda a: TorchOps(), runner=runner,
    sampler=lambda a: Sampler(a.args.seed), scheduler=scheduler, step=lambda a: PlainStep())),)
LLM, build_engine = entry_points(STAGES)
