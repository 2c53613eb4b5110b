"""Where a step's time goes: host work, GPU work, and the launches between them.

Two measurements, because a profiler that records every launch also slows every launch:

1. ``engine.profile = True`` (no profiler): per step, the wall time, the time the host then
   waits for the GPU (a synchronize right after the forward, before the sampler's own sync),
   and host time = wall - wait: scheduling, inputs, launches, sampling, stop checks.
2. ``kernel_profile(fn)``: torch.profiler around ``fn``; counts the GPU kernels that ran, the
   host launch calls that started them (a CUDA-graph replay is one), and the GPU busy time
   (the union of kernel intervals, so overlapping kernels are not counted twice).

GPU busy % of a step = busy time / wall time of the unprofiled run.
"""
from __future__ import annotations

import torch

LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch",
                "cudaMemcpyAsync", "cudaMemsetAsync")


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def kernel_profile(fn) -> dict:
    """Run ``fn()`` once under torch.profiler (CUDA only). Kernels, launch calls, busy ms."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels, launches, graph_launches, intervals, by_name = 0, 0, 0, [], {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
            intervals.append((e.time_range.start, e.time_range.end))
            n = by_name.setdefault(e.name[:60], [0, 0.0])
            n[0] += 1
            n[1] += e.time_range.end - e.time_range.start
        elif e.name in LAUNCH_CALLS:
            launches += 1
            graph_launches += e.name == "cudaGraphLaunch"
    return dict(kernels=kernels, launch_calls=launches, graph_launches=graph_launches,
                gpu_busy_ms=_busy_us(intervals) / 1e3,
                top=sorted(([k, c, us / 1e3] for k, (c, us) in by_name.items()), key=lambda x: -x[2])[:12])


def summarize_timings(timings: list[dict]) -> dict:
    """Per mode (graph B / eager): steps, mean wall / host / wait ms."""
    out = {}
    for t in timings:
        m = out.setdefault(t["mode"], dict(steps=0))
        m["steps"] += 1
        for k, v in t.items():
            if k != "mode":
                m[k] = m.get(k, 0) + v
    for m in out.values():
        for k in m:
            if k.endswith("_ms"):
                m[k] /= m["steps"]
    return out
