"""Where a step's time goes: host work, GPU work, and the launches between them.

Two measurements, because a profiler that records every launch also slows every launch:

1. ``Profiler`` (no CUDA profiler): a part composed into the engine by the assembler
   (``build_engine(..., wrap=profiler.wrap)``), which wraps the engine's parts before the loop
   gets them. Per step it records the wall time, the time the host then waits for the GPU (a
   synchronize right after the forward, before the sampler's own sync), host time = wall - wait,
   and the host parts: schedule, execute (the runner: inputs, copy, launches), advance, sample
   (the sampler call). The rest of host time is the engine loop itself: stop checks, outputs, stats.
   With async scheduling (the engine's overlapped order) that synchronize serialises the step, so
   the profile shows the host work the order hides, not the overlap; time unprofiled steps for that.
2. ``kernel_profile(fn)``: torch.profiler around ``fn``; counts the GPU kernels that ran, the
   host launch calls that started them (a CUDA-graph replay is one), and the GPU busy time
   (the union of kernel intervals, so overlapping kernels are not counted twice).

GPU busy % of a step = busy time / wall time of the unprofiled run.
"""
from __future__ import annotations

import time

import torch

TIMED = {"scheduler": ("schedule", "advance"), "runner": ("execute",), "sampler": ("__call__", "launch")}
NAMES = {"schedule": "schedule", "advance": "advance", "execute": "execute", "__call__": "sample", "launch": "sample"}


class Profiler:
    """``build_engine(..., wrap=p.wrap)``, then ``p.step(engine)`` instead of ``engine.step()``."""

    def __init__(self):
        self.timings: list[dict] = []               # per step: wall / wait / host ms, mode, tokens, parts
        self._parts: dict[str, float] = {}
        self._wait = 0.0

    def wrap(self, name: str, part):
        """The assembler's ``wrap``: time this part's methods (TIMED)."""
        return _Timed(part, self, TIMED.get(name, ()))

    def add(self, name: str, seconds: float) -> None:
        self._parts[name] = self._parts.get(name, 0.0) + seconds

    def step(self, engine):
        self._parts, self._wait = {}, 0.0
        t0, n = time.perf_counter(), len(engine.stats)
        results = engine.step()
        wall = time.perf_counter() - t0
        if len(engine.stats) == n:               # async scheduling's last call: it only took the tokens
            return results
        st = engine.stats[-1]
        self.timings.append(dict(wall_ms=wall * 1e3, wait_ms=self._wait * 1e3, host_ms=(wall - self._wait) * 1e3,
                                 mode=engine.runner.mode_log[-1], tokens=st.prefill_tokens + st.decode_tokens,
                                 **{f"{k}_ms": v * 1e3 for k, v in self._parts.items()}))
        return results


class _Timed:
    """A part with the same methods; the ones named are timed. The runner's execute is followed by a
    synchronize (timed as the wait), so the host's share and the GPU's are told apart."""

    def __init__(self, part, profiler: Profiler, names):
        self._part = part
        cuda = torch.cuda.is_available()
        for name in names:                           # the timed methods, made once
            setattr(self, "_call" if name == "__call__" else name,
                    _timer(getattr(part, name), profiler, NAMES[name], cuda and name == "execute"))

    def __getattr__(self, name):                     # everything else: the part's own
        return getattr(self._part, name)

    def __call__(self, *a, **k):
        return self._call(*a, **k)


def _timer(method, profiler: Profiler, label: str, sync: bool):
    def timed(*a, **k):
        t = time.perf_counter()
        r = method(*a, **k)
        profiler.add(label, time.perf_counter() - t)
        if sync:
            t = time.perf_counter()
            torch.cuda.synchronize()
            profiler._wait += time.perf_counter() - t
        return r
    return timed


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
