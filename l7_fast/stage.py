"""Stage 7's contribution to the assembler: eight options and the fast parts.

    slot          part                                            options it reads
    kv_cache      FastKVCache (cache.py): a PAD block, split-KV   impl
    ops           FusedOps (ops.py), or stage 5's TorchOps        fused_ops, gemv, norm_prologue, pdl
    inputs        StepInputs (step_inputs.py): one pinned copy    (the sizes)
    eager_runner  FastRunner (runner.py)                          split_kv, check
    runner        GraphRunner (graphs.py) around it on a GPU,     enforce_eager, prefill_graphs
                  after start-up compiles every kernel variant (warmup.py)
    step          OverlappedStep (step.py), or stage 5's order    async_scheduling

On a CPU there is no CUDA graph: every step runs eagerly, through the Triton interpreter.
"""
from __future__ import annotations

import sys

from l5_scheduler.assemble import Stage
from l5_scheduler.llm import entry_points
from l6_prefix_cache.stage import STAGES as BEFORE

from .cache import FastKVCache
from .gemv import GEMV_MAX_M
from .graphs import GraphRunner
from .ops import FusedOps
from .options import OPTIONS
from .runner import FastRunner, step_inputs
from .step import OverlappedStep
from .warmup import warm_up


def kv_cache(a):
    p = next(a.model.parameters())
    return FastKVCache(a.model.cfg, a.config.num_blocks, a.config.block_size, p.device, p.dtype, impl=a.args.impl)


def ops(a):
    x = a.args
    return FusedOps(a.model, gemv_max_m=GEMV_MAX_M if x.gemv else 0, norm_prologue=x.norm_prologue,
                    pdl=x.pdl) if x.fused_ops else None


def eager_runner(a):
    return FastRunner(a.model, a.config, a.part("ops"), cache=a.part("kv_cache"), inputs=a.part("inputs"),
                      check=a.args.check, split_kv=a.args.split_kv)


def runner(a):
    r = a.part("eager_runner")
    if r.device.type != "cuda":
        return r
    r.warmup_report = warm_up(r, progress=True)                # nothing compiles after start-up
    print(r.warmup_report.line(), file=sys.stderr)
    if a.args.enforce_eager or a.args.impl != "triton":        # the torch reference cannot be captured
        return r
    return GraphRunner(r, prefill=a.args.prefill_graphs)


STAGES = BEFORE + (Stage("l7_fast", OPTIONS, dict(
    kv_cache=kv_cache, ops=ops,
    inputs=lambda a: step_inputs(a.config, a.device, a.part("kv_cache").pad_block),
    eager_runner=eager_runner, runner=runner,
    step=lambda a: OverlappedStep(a.part("eager_runner")) if a.args.async_scheduling else None)),)
LLM, build_engine = entry_points(STAGES)
