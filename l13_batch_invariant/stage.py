"""Stage 13's contribution to the assembler: one option and two parts, taken when it is on.

    slot      part                                                  options it reads
    ops       InvariantOps (ops.py): every matmul, the lm_head's    batch_invariant
              too, by matmul.py (one tile for every M, K cut at
              fixed points); norms by stage 7's per-row kernel
    kv_cache  InvariantKVCache (cache.py): stage 7's storage, and   batch_invariant
              attention cut at fixed key positions (attention.py)

With ``batch_invariant=False`` (the default) both makers return None: the engine is stage 12's,
part for part. With it, every other part is the earlier stages' (scheduler, KV manager, runner and
its CUDA graphs, sampler, step order). What the two parts do not cover is refused in one line:
several ranks (their all-reduces add in another order than one GPU's sums), windowed checkpoints
and an e4m3 cache (their own attention kernels), and the torch reference attention.
"""
from __future__ import annotations

import sys

from l5_scheduler.assemble import Stage
from l5_scheduler.llm import entry_points
from l8_sliding_window.stage import windowed
from l12_tensor_parallel.stage import STAGES as BEFORE
from plumbing.errors import UserError, WindowsUnsupported

from .cache import InvariantKVCache
from .ops import InvariantOps
from .options import OPTIONS

NAME = "l13_batch_invariant"
IGNORED = ("fused_ops", "gemv", "norm_prologue", "pdl")      # stage 7's choices among ops this mode replaces


def refuse(a) -> None:
    """One line for each configuration this mode's parts do not cover. The KV cache is the first part
    the assembler asks for (the pool), so these come before any weight loads or any rank starts; the
    windows, last, need the model."""
    x = a.args
    if x.tensor_parallel_size > 1:
        raise UserError(f"batch_invariant runs on one GPU: tensor_parallel_size {x.tensor_parallel_size} adds partial "
                        "sums across ranks in another order than one GPU's. Leave one of them out.")
    if x.kv_cache_dtype != "auto":
        raise UserError(f"batch_invariant keeps K/V in the model's dtype: kv_cache_dtype={x.kv_cache_dtype!r} has its "
                        "own attention kernel, not made invariant yet. Use kv_cache_dtype='auto'.")
    if windowed(a):
        raise WindowsUnsupported("batch_invariant covers full-attention checkpoints: this one has sliding windows, "
                                 "whose attention kernel is not made invariant yet. Leave batch_invariant off.")
    if x.impl != "triton":
        raise UserError(f"batch_invariant needs the Triton kernels (impl={x.impl!r}): pass impl='triton' (on a CPU "
                        "they run through the interpreter, slowly).")


def ops(a):
    """InvariantOps: every matmul and the lm_head by matmul.py, norms per row (batch_invariant)."""
    if not a.args.batch_invariant:
        return None
    refuse(a)
    given = [k for k in IGNORED if k in a.args.given]
    if given:
        print(f"l13_batch_invariant: {', '.join(given)} ignored: batch_invariant runs its own ops (every matmul by "
              "one kernel, whatever the rows)", file=sys.stderr)
    return InvariantOps(a.model)


def kv_cache(a):
    """InvariantKVCache: stage 7's storage, attention cut at fixed key positions (batch_invariant)."""
    if not a.args.batch_invariant:
        return None
    refuse(a)
    p = next(a.model.parameters())
    return InvariantKVCache(a.model.cfg, a.config.num_blocks, a.config.block_size, p.device, p.dtype,
                            impl=a.args.impl)


STAGES = BEFORE + (Stage(NAME, OPTIONS, dict(ops=ops, kv_cache=kv_cache)),)
LLM, build_engine = entry_points(STAGES)
