"""Timing for the stage 7 kernels' check-then-benchmark mains: kernel vs torch op vs copy bandwidth.

Memory-bound kernels are scored in GB/s (bytes the op must move / time) against a device-to-device
copy measured in the same run, and against the torch path they replace (which moves more bytes:
every intermediate of the eager ops goes through memory). Three times per case:

* graph: the GPU time alone. ``reps`` calls are captured in one CUDA graph, each after a 256 MB
  write that flushes L2; the flushes are timed in a graph of their own and subtracted. This is
  what a CUDA-graph decode step (stage 7) pays, and the number the GB/s columns use.
* eager: stage 3's ``do_bench`` (CUDA events around each call, L2 flushed). It includes the host's
  launch cost whenever the host is slower than the GPU, as at small shapes.
* host: Python + launch cost of one call, back-to-back calls with no sync.
"""
from __future__ import annotations

import time

import torch

from plumbing.runtime import INTERPRET
from scripts.bench_attention import copy_bandwidth, timer

#: (dtype, atol = rtol) for the mains' checks. No bfloat16 under the interpreter: triton 3.9's
#: interpreter truncates float32 -> bfloat16 casts (the GPU rounds to nearest even), so the
#: rounding order is checked in float16 there, where its casts round like the GPU's.
CHECKS = ((torch.float32, 1e-5), (torch.float16, 1e-3)) + (() if INTERPRET else ((torch.bfloat16, 1.5e-2),))

HEADER = ("| op | shape | bytes | triton µs (graph) | GB/s | % of copy BW | triton µs (eager) | host µs/call "
          "| torch µs (graph) | torch µs (eager) | torch / triton (graph) |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def graph_ms(fn, reps: int = 10, trials: int = 7) -> float:
    """Median GPU milliseconds of one ``fn()`` replayed from a CUDA graph, L2 flushed before each."""
    flush = torch.empty(256 * 2 ** 20, dtype=torch.int8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                     # warm up off the capture stream (compiles too)
        fn()
    torch.cuda.current_stream().wait_stream(side)

    def capture(with_fn):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                flush.zero_()
                if with_fn:
                    fn()
        return g

    def median_ms(g):
        g.replay()
        times = []
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[trials // 2]
    return max(0.0, median_ms(capture(True)) - median_ms(capture(False))) / reps


def try_graph_ms(fn) -> float:
    """``graph_ms`` for a peer, which must not stop the benchmark if it cannot be captured (nan)."""
    try:
        return graph_ms(fn)
    except Exception as e:  # noqa: BLE001
        print(f"  graph capture failed: {type(e).__name__}: {str(e)[:160]}")
        torch.cuda.synchronize()
        return float("nan")


def host_us(fn, n: int = 200) -> float:
    """Host microseconds per call: ``n`` calls back-to-back, no synchronisation in between."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / n * 1e6


class Bench:
    """``Bench()`` measures the copy bandwidth once (GPU only); ``row(...)`` times one case and prints it."""

    def __init__(self):
        self.eager = timer("cuda")
        self.copy_gbps = copy_bandwidth(self.eager, "cuda", 2 ** 30)
        print(f"{torch.cuda.get_device_name()}: copy bandwidth {self.copy_gbps:.0f} GB/s (read + write); "
              f"torch {torch.__version__}")
        self.rows = []

    def pct(self, nbytes: int, ms: float) -> float:
        return 100 * nbytes / ms / 1e6 / self.copy_gbps

    def row(self, op: str, shape: str, nbytes: int, kernel, reference) -> dict:
        k_ms, r_ms = graph_ms(kernel), try_graph_ms(reference)
        r = dict(op=op, shape=shape, bytes=nbytes, triton_us=k_ms * 1e3, triton_GBps=nbytes / k_ms / 1e6,
                 pct_copy=self.pct(nbytes, k_ms), triton_eager_us=self.eager(kernel) * 1e3,
                 host_us=host_us(kernel), torch_us=r_ms * 1e3, torch_eager_us=self.eager(reference) * 1e3)
        self.rows.append(r)
        if len(self.rows) == 1:
            print(HEADER)
        print(f"| {op} | {shape} | {nbytes} | {r['triton_us']:.1f} | {r['triton_GBps']:.0f} | {r['pct_copy']:.0f}% | "
              f"{r['triton_eager_us']:.1f} | {r['host_us']:.1f} | {r['torch_us']:.1f} | {r['torch_eager_us']:.1f} | "
              f"{r_ms / k_ms:.2f}x |")
        return r


def fraction_equal(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements with exactly equal values (finer than a tolerance: 1.0 = same bits but for ±0)."""
    return (a.reshape(-1) == b.reshape(-1)).float().mean().item()
