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
    """FastKVCache: a PAD block for graph padding, the fused write, split-KV decode."""
    p = next(a.model.parameters())
    return FastKVCache(a.model.cfg, a.config.num_blocks, a.config.block_size, p.device, p.dtype, impl=a.args.impl)


def ops(a):
    """FusedOps: norms, RoPE + K/V write, SiLU, GEMV in Triton (fused_ops, gemv, norm_prologue, pdl)."""
    x = a.args
    return FusedOps(a.model, gemv_max_m=GEMV_MAX_M if x.gemv else 0, norm_prologue=x.norm_prologue,
                    pdl=x.pdl) if x.fused_ops else None


def inputs(a):
    """StepInputs: one pinned copy a step, the block table sent by diffs."""
    return step_inputs(a.config, a.device, a.part("kv_cache").pad_block)


def eager_runner(a):
    """FastRunner: persistent inputs, split-KV decode (split_kv), checks (check)."""
    return FastRunner(a.model, a.config, a.part("ops"), cache=a.part("kv_cache"), inputs=a.part("inputs"),
                      check=a.args.check, split_kv=a.args.split_kv)


def runner(a):
    """GraphRunner: CUDA graphs around the FastRunner on a GPU, after start-up compiles (enforce_eager,
    prefill_graphs); the FastRunner itself elsewhere."""
    r = a.part("eager_runner")
    if r.device.type != "cuda":
        return r
    r.warmup_report = warm_up(r, progress=True)                # nothing compiles after start-up
    print(r.warmup_report.line(), file=sys.stderr)
    if a.args.enforce_eager or a.args.impl != "triton":        # the torch reference cannot be captured
        return r
    return GraphRunner(r, prefill=a.args.prefill_graphs)


def step(a):
    """OverlappedStep: step n+1 launched before step n's tokens reach the host (async_scheduling)."""
    return OverlappedStep(a.part("eager_runner")) if a.args.async_scheduling else None


STAGES = BEFORE + (Stage("l7_fast", OPTIONS, dict(kv_cache=kv_cache, ops=ops, inputs=inputs,
                                                   eager_runner=eager_runner, runner=runner, step=step)),)
LLM, build_engine = entry_points(STAGES)
