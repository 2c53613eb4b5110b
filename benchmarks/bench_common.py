"""What the GPU benchmarks share: workloads, syncs, the device check, and the copy bandwidth and
matmul rate measured on the machine (every roofline divides by these). The random-weight
checkpoint they run is harness/random_checkpoint.py's; where they write is outputs.py's."""
from __future__ import annotations

import gc
import random
import sys
import time

import torch

from benchmarks.timing import graph_ms


def workload(n, lo, hi, vocab, seed):
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi)) for _ in range(n)]


def timed(device, fn) -> float:
    """Milliseconds of one ``fn()``: from a CUDA graph with L2 flushed on a GPU (timing.graph_ms),
    wall time on a CPU (the interpreter: a smoke test, not performance)."""
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return graph_ms(fn)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def ceilings(device):
    """Copy bandwidth (GB/s, read + write) and bf16 matmul rate (TFLOP/s), measured here (None on a CPU)."""
    if device != "cuda":
        return None, None
    import triton
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    bw = 2 * x.numel() / (triton.testing.do_bench(lambda: y.copy_(x), return_mode="median") * 1e-3) / 1e9
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    tf = 2 * 8192**3 / (triton.testing.do_bench(lambda: a @ a, return_mode="median") * 1e-3) / 1e12
    del x, y, a
    free()
    return bw, tf


def bench_device(quick: bool) -> str:
    """"cuda", or "cpu" for a --quick smoke test (a full run on a CPU exits: its numbers mean nothing)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not quick:
        sys.exit("no GPU: run with --quick to smoke-test the script (CPU numbers are not performance)")
    return device


#: what a --quick run prints where a full run prints its goal verdicts
NOT_JUDGED = "goals: not judged (--quick smoke-tests the script; its numbers are not a measurement)"
