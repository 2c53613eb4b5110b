"""How the benchmarks take a time (the lowest helper: it imports no other benchmark module).

* ``timer``: stage 3's ``do_bench`` (CUDA events around each call, L2 flushed before each). It
  includes the host's launch cost whenever the host is slower than the GPU, as at small shapes.
  On a CPU: wall time of a few calls (the interpreter: a smoke test, not performance).
* ``graph_ms``: the GPU time alone. ``reps`` calls are captured in one CUDA graph, each after a
  256 MB write that flushes L2; the flushes are timed in a graph of their own and subtracted. This
  is what a CUDA-graph decode step (stage 7) pays.
* ``host_us``: Python + launch cost of one call, back-to-back calls with no sync.
* ``collective_us``: a call every rank makes together (an all-reduce), eager and replayed from a
  CUDA graph, each timing started by ``line_up`` (the ranks meet, then sync).
* ``copy_bandwidth``: a device-to-device copy, the roofline every memory-bound figure is scored
  against (bytes read + written).
"""
from __future__ import annotations

import time

import torch


def timer(device):
    """Median milliseconds. GPU: triton's do_bench (CUDA events, L2 flushed before each call)."""
    if device == "cuda":
        import triton
        return lambda fn, rep=100: triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")

    def cpu_time(fn, rep=None):
        fn()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        return (time.perf_counter() - t0) / 3 * 1e3
    return cpu_time


def copy_bandwidth(bench, device, nbytes):
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / (bench(lambda: dst.copy_(src)) * 1e-3) / 1e9   # GB/s, read + write


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


def collective_us(fn, x, line_up, iters: int = 100, graph_reps: int = 20, replays: int = 10) -> dict:
    """µs a call of ``fn(x)``: eager (``iters`` back to back: what the host's launch allows) and
    replayed from a CUDA graph of ``graph_reps`` calls (``replays`` times). A capture that fails is
    said (``graph_error``), not hidden."""
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    line_up()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn(x)
    b.record()
    torch.cuda.synchronize()
    row = dict(eager_us=a.elapsed_time(b) / iters * 1e3)
    try:
        g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.graph(g, stream=s):
            for _ in range(graph_reps):
                fn(x)
        g.replay()
        torch.cuda.synchronize()
        line_up()
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        row["graph_us"] = a.elapsed_time(b) / (replays * graph_reps) * 1e3
    except Exception as e:                           # noqa: BLE001  (reported, not hidden)
        row["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return row
