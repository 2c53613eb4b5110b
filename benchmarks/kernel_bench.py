"""The table of the stage 7 kernels' check-then-benchmark mains: kernel vs torch op vs copy bandwidth.

Memory-bound kernels are scored in GB/s (bytes the op must move / time) against a device-to-device
copy measured in the same run, and against the torch path they replace (which moves more bytes:
every intermediate of the eager ops goes through memory). Three times per case (timing.py says how
each is taken): graph (``graph_ms``, the number the GB/s columns use), eager (``timer``) and host
(``host_us``).
"""
from __future__ import annotations

import torch

from benchmarks.timing import copy_bandwidth, graph_ms, host_us, timer, try_graph_ms
from plumbing.runtime import INTERPRET

#: (dtype, atol = rtol) for the mains' checks. No bfloat16 under the interpreter: triton 3.9's
#: interpreter truncates float32 -> bfloat16 casts (the GPU rounds to nearest even), so the
#: rounding order is checked in float16 there, where its casts round like the GPU's.
CHECKS = ((torch.float32, 1e-5), (torch.float16, 1e-3)) + (() if INTERPRET else ((torch.bfloat16, 1.5e-2),))

HEADER = ("| op | shape | bytes | triton µs (graph) | GB/s | % of copy BW | triton µs (eager) | host µs/call "
          "| torch µs (graph) | torch µs (eager) | torch / triton (graph) |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


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
