"""``LLM`` with stage 7's parts: stage 6's engine (the one loop of stage 5, the prefix-caching KV
manager), given a fast runner.

    from l7_fast import LLM, SamplingParams
    llm = LLM(None)                                   # the built-in tiny Qwen3
    llm = LLM(None, enforce_eager=True)               # no CUDA graphs (vLLM's name)
    llm = LLM(None, fused_ops=False, split_kv=False)  # the torch ops, stage 3's attention kernel
    llm = LLM(None, gemv=False)                       # cuBLAS for every matmul, small steps too
    llm = LLM(None, norm_prologue=False)              # small steps: each add + RMSNorm its own kernel
    llm = LLM(None, prefill_graphs=False)             # a lone short prompt runs eagerly, as before
    llm = LLM(None, async_scheduling=False)           # each step waits for its tokens before the next
    llm.llm_engine.runner.graph_bytes                 # memory the captured graphs hold

The parts stage 7 adds, each its own file and each switchable:

    ops        FusedOps (ops.py: fused_norm, fused_act, fused_rope, gemv)   or the skeleton's TorchOps
    attention  split-KV for small decode batches (attention_split.py, cache.py)
    inputs     one pinned copy per step, the block table updated by diffs (step_inputs.py)
    runner     FastRunner, eager (runner.py), wrapped by GraphRunner (graphs.py) on a GPU
    start-up   on a GPU, every kernel variant the engine can launch is compiled first (warmup.py)
    the loop   async scheduling: the engine's overlapped step order (l5_scheduler/engine.py)
    profiler   optional: times the parts of each step (profile.py)

On a CPU there is no CUDA graph: every step runs eagerly, through the Triton interpreter.
"""
from __future__ import annotations

import sys

from l1_dense.model import TorchOps
from l5_scheduler import llm as stage5
from l6_prefix_cache import llm as stage6

from .gemv import GEMV_MAX_M
from .graphs import GraphRunner
from .ops import FusedOps
from .runner import FastRunner
from .warmup import warm_up


def make_ops(model, *, fused_ops: bool = True, gemv: bool = True, norm_prologue: bool = True, pdl: bool = True):
    """The ops part: stage 7's fused kernels, or the skeleton's torch ops."""
    if not fused_ops:
        return TorchOps()
    return FusedOps(model, gemv_max_m=GEMV_MAX_M if gemv else 0, norm_prologue=norm_prologue, pdl=pdl)


def build_engine(model, tokenizer, config, *, enable_prefix_caching: bool = True, enforce_eager: bool = False,
                 fused_ops: bool = True, split_kv: bool = True, gemv: bool = True, norm_prologue: bool = True,
                 pdl: bool = True, profiler=None, impl: str = "triton", check: bool = False, runner=None, verify_graphs: tuple[int, int] | None = None,
                 prefill_graphs: bool = True, async_scheduling: bool = True, **kw):
    """Stage 6's builder with stage 7's runner (and, with ``profiler``, every part timed). ``runner``:
    an eager FastRunner a later stage built with its own parts (stage 8: its cache and groups);
    it is warmed up and given CUDA graphs here, like stage 7's own. ``verify_graphs`` (q, max
    batch): graphs for lesson 11's verify steps too; ``prefill_graphs``: for one request's short
    prefill too (graphs.py); ``async_scheduling``: the engine's overlapped step order; ``pdl``: the
    GEMVs, rope write, split-KV and merge with programmatic dependent launch on Hopper (off on
    other devices: pdl.pdl_supported; lesson 7.12)."""
    if runner is None:
        ops = make_ops(model, fused_ops=fused_ops, gemv=gemv, norm_prologue=norm_prologue, pdl=pdl)
        runner = FastRunner(model, config, ops, impl=impl, check=check, split_kv=split_kv)
    if runner.device.type == "cuda":                 # nothing compiles after start-up (warmup.py)
        runner.warmup_report = warm_up(runner, progress=True)
        print(runner.warmup_report.line(), file=sys.stderr)
    if not enforce_eager and runner.device.type == "cuda" and impl == "triton":
        runner = GraphRunner(runner, verify_graphs, prefill_graphs)  # the torch reference attention cannot be captured
    return stage6.build_engine(model, tokenizer, config, enable_prefix_caching=enable_prefix_caching, runner=runner,
                               async_scheduling=async_scheduling,
                               wrap=profiler.wrap if profiler is not None else None, impl=impl, check=check, **kw)


def LLM(model: str | None = None, **kw) -> stage5.LLM:
    """``l5_scheduler.LLM`` built by this stage's ``build_engine``; every stage 5 and 6 argument works."""
    return stage5.LLM(model, build_engine=build_engine, **kw)
