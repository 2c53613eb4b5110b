"""Timing for the stage 7 kernels' check-then-benchmark mains: kernel vs torch op vs copy bandwidth.

Memory-bound kernels are scored in GB/s (bytes the op must move / median time) against a
device-to-device copy measured in the same run, and against the torch path they replace (which
moves more bytes: every intermediate of the eager ops goes through memory). The timer and the
copy measurement are stage 3's (scripts/bench_attention.py), so all benchmarks read alike.
"""
from __future__ import annotations

import torch

from l1_dense.runtime import INTERPRET
from scripts.bench_attention import copy_bandwidth, timer

#: (dtype, atol = rtol) for the mains' checks. No bfloat16 under the interpreter: triton 3.9's
#: interpreter truncates float32 -> bfloat16 casts (the GPU rounds to nearest even), so the
#: rounding order is checked in float16 there, where its casts round like the GPU's.
CHECKS = ((torch.float32, 1e-5), (torch.float16, 1e-3)) + (() if INTERPRET else ((torch.bfloat16, 1.5e-2),))

HEADER = ("| op | shape | bytes | triton µs | triton GB/s | % of copy BW | torch µs | torch / triton |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|")


class Bench:
    """``Bench(device)`` measures the copy bandwidth once; ``row(...)`` times one case and prints it."""

    def __init__(self, device: str):
        self.device = device
        self.time = timer(device)
        self.copy_gbps = copy_bandwidth(self.time, device, 2 ** 30 if device == "cuda" else 2 ** 22)
        name = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter: NOT performance)"
        print(f"{name}: copy bandwidth {self.copy_gbps:.0f} GB/s (read + write)")
        self.rows = []

    def row(self, op: str, shape: str, nbytes: int, kernel, reference) -> dict:
        k_ms, r_ms = self.time(kernel), self.time(reference)
        gbps = nbytes / k_ms / 1e6
        r = dict(op=op, shape=shape, bytes=nbytes, triton_us=k_ms * 1e3, triton_GBps=gbps,
                 pct_copy=100 * gbps / self.copy_gbps, torch_us=r_ms * 1e3, speedup=r_ms / k_ms)
        self.rows.append(r)
        if len(self.rows) == 1:
            print(HEADER)
        print(f"| {op} | {shape} | {nbytes} | {r['triton_us']:.1f} | {gbps:.0f} | {r['pct_copy']:.0f}% | "
              f"{r['torch_us']:.1f} | {r['speedup']:.2f}x |")
        return r


def fraction_equal(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements with exactly equal values (finer than a tolerance: 1.0 = same bits but for ±0)."""
    return (a.view(-1) == b.view(-1)).float().mean().item()
