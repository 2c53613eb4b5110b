"""Start-up compilation: every kernel variant the engine can launch, compiled before the first request.

Triton compiles a kernel the first time it is launched as a new *variant*: new constexpr values
(tile sizes, flags), new ``num_warps``/``num_stages``, a new dtype, an int argument that becomes 1
or a multiple of 16, a pointer that becomes (un)aligned to 16 bytes. A compile takes 0.2-1 s. If
the first request meets a variant nobody launched yet, the GPU waits while the host compiles:
a fresh machine's first benchmark measured the GPU idle for 2.5 s of its timed region.

Which variants a step launches is a function of host ints only (the runner's and the kernels'
pickers), so they can be listed before any request arrives:

    decode step of n requests   bucket B = smallest graph bucket >= n; split-KV with
                                decode_splits(B) > 1 splits (split tile, SPLITS_PAD = next pow2)
                                or stage 3's decode tile
    any other step              stage 3's tile: pick_config(max_seqlen_q, T, S), which depends
                                on max_seqlen_q and on whether the step is "mixed" (2T < S q)
    matmuls of <= GEMV_MAX_M    gemv.py's kernel, BLOCK_M = next power of two >= the step's
    tokens (FusedOps)           tokens (1, 2, 4, 8); more tokens go to cuBLAS, which needs none
    norm, SiLU-mul, rope        one variant each per model (their constexprs are model sizes)

The variants that differ by accident were removed instead of compiled: every field of the step
inputs starts on a 16-byte boundary (step_inputs.py), and ``num_splits`` (and the GEMV's row count
``M``) is not specialised (``do_not_specialize``): it reaches the kernels as a runtime int.

``plan(runner)`` walks every step shape the scheduler can produce (max_seqlen_q from 2 to the
budget, alone or as the chunk of a mixed step; every decode bucket) through those pickers and
keeps one shape per distinct pair (attention choice, matmul choice). ``warm_up(runner)`` runs
the real forward pass once per shape, on padding (PAD slots, the PAD block-table row), so the
launches are the serving path's own, arguments and alignments included. tests/test_l7_warmup.py records every launch of a
varied workload and checks that start-up launched each one.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch

from l3_paged.kernel_config import pick_config
from plumbing.runtime import INTERPRET  # noqa: F401  (before triton: where kernels run)

import triton

from .attention_split import split_config
from .ops import FusedOps
from .step_inputs import Layout


def attention_choice(runner, max_q: int, T: int, S: int, decode: bool) -> tuple:
    """What the attention launches of a step depend on, as ``FastRunner.execute`` and the kernels
    decide it (cache.attend_cached -> attention_split -> attention_triton)."""
    if runner.cache.impl == "torch":
        return ("torch reference",)
    cfg, dtype = runner.cfg, runner.cache.K[0].dtype
    g_pad = triton.next_power_of_2(cfg.num_heads // cfg.num_kv_heads)
    d_pad = max(16, triton.next_power_of_2(cfg.head_dim))
    if decode:
        splits = runner.step_splits(S, True)
        if splits > 1 and cfg.head_dim <= 256:
            keys = triton.cdiv(runner.buf.table.shape[1] * runner.block_size, splits)   # the kernel's bound / splits
            return ("split", split_config(S, g_pad, d_pad, dtype, keys), triton.next_power_of_2(splits))
        max_q = 1
    return ("paged", pick_config(max_q, T, S, g_pad, d_pad, dtype))


def matmul_choice(runner, T: int) -> int | None:
    """The GEMV tile of a step of T tokens (FusedOps.matmul), or None: cuBLAS, nothing to compile."""
    return runner.ops.gemv_tile(T) if isinstance(runner.ops, FusedOps) else None


@dataclass(frozen=True)
class Shape:
    q_lens: tuple                  # query tokens per sequence (decode: all 1)
    choice: tuple                  # (attention_choice, matmul_choice) of the step

    def label(self) -> str:
        S, q = len(self.q_lens), max(self.q_lens)
        kind = "decode" if q == 1 else "prefill" if S == 1 else "mixed"
        return f"{kind} S={S} max_q={q}"


def plan(runner) -> list[Shape]:
    """One step shape per distinct (attention, matmul) choice the engine can make (smallest first)."""
    c = runner.config
    seen: dict[tuple, Shape] = {}

    def keep(q_lens, decode):
        T = sum(q_lens)
        choice = (attention_choice(runner, max(q_lens), T, len(q_lens), decode), matmul_choice(runner, T))
        if choice not in seen:
            seen[choice] = Shape(tuple(q_lens), choice)
    for B in runner.buckets:                                    # every decode step replays or runs as a bucket
        keep([1] * B, True)
    for q in range(2, min(c.max_num_batched_tokens, c.max_model_len) + 1):
        keep([q], False)                                        # a prefill (or chunk) alone
        S = min(c.max_num_seqs, c.max_num_batched_tokens - q + 1)
        if S >= 2:                                              # the chunk with S - 1 decodes: the most "mixed"
            keep([q] + [1] * (S - 1), False)
    return list(seen.values())


def run_shape(runner, q_lens) -> None:
    """One forward pass of the serving path on padding: every token writes the PAD slot, every
    sequence reads the PAD row of the block table."""
    T, S = sum(q_lens), len(q_lens)
    decode = T == S
    positions = [p for q in q_lens for p in range(q)]
    cu = [0]
    for q in q_lens:
        cu.append(cu[-1] + q)
    lay = Layout(T, S, S, 0)
    runner.buf.write(lay, [0] * T, positions, [runner.cache.pad_slot] * T, [x - 1 for x in cu[1:]], cu,
                     list(q_lens), [runner.buf.pad_row] * S, [], [])
    runner.buf.upload(lay)
    runner.forward(lay, max(q_lens), max(q_lens), runner.step_splits(S, decode))


def triton_cache_dir() -> str:
    try:
        from triton import knobs
        return knobs.cache.dir
    except (ImportError, AttributeError):                      # triton before knobs
        from triton.runtime.cache import default_cache_dir
        return os.environ.get("TRITON_CACHE_DIR") or default_cache_dir()


def cache_entries(path: str | None = None) -> set[str]:
    """The Triton cache's entries (one directory per compiled kernel or launcher)."""
    path = path or triton_cache_dir()
    try:
        return set(os.listdir(path))
    except FileNotFoundError:
        return set()


@dataclass
class WarmupReport:
    shapes: list
    seconds: float
    new_entries: int               # Triton cache entries written during warm-up: 0 = all from the cache
    cache_dir: str

    def line(self) -> str:
        state = "warm: every variant came from the cache" if not self.new_entries else \
            f"{self.new_entries} new cache entries (compiled)"
        return f"start-up: {len(self.shapes)} step shapes run, every kernel variant ready, in {self.seconds:.1f} s " \
               f"(Triton cache {self.cache_dir}: {state})"


def warm_up(runner, progress: bool = False) -> WarmupReport:
    """Run every planned shape once, compiling what the Triton cache lacks. ``progress``: a status
    line on stderr (rewritten in place on a terminal; one line otherwise)."""
    shapes = plan(runner)
    cache_dir = triton_cache_dir()
    before = cache_entries(cache_dir)
    tty = sys.stderr.isatty()
    t0 = time.perf_counter()
    for i, s in enumerate(shapes):
        if progress and (tty or i == 0):
            print(f"start-up: compiling kernel variants, step shape {i + 1}/{len(shapes)} ({s.label()}), "
                  f"{time.perf_counter() - t0:.1f} s", end="\r" if tty else "\n", file=sys.stderr, flush=True)
        run_shape(runner, s.q_lens)
    if runner.device.type == "cuda":
        torch.cuda.synchronize()
    if progress and tty:
        print(" " * 100, end="\r", file=sys.stderr)
    return WarmupReport(shapes, time.perf_counter() - t0, len(cache_entries(cache_dir) - before), cache_dir)
