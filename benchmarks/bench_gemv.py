"""The small-M GEMV (l7_fast/gemv.py) against cuBLAS: checks, then times (``bench_l7_kernels.py --kernel gemv``).

Checks: gemv vs F.linear (with a bias) and vs silu_mul(F.linear) on a merged [gate; up] weight,
M = 1, 3, 8, in float32, float16 (and bfloat16 on a GPU). Times (GPU): Qwen3-0.6B's four matmuls
of a layer at M = 1, 2, 4, 8, 16, 32, GEMV vs cuBLAS (+ silu_mul for gate/up) in CUDA-graph replay with L2
flushed before each call, as a decode step's graph pays them. ``--gemv-sweep`` also tries every
(BLOCK_N, BLOCK_K, num_warps) at M = 1 and 2 and prints the best: gemv_config's rule comes from it.
Then the add + RMSNorm in the GEMV's prologue against the norm kernel + GEMV (qkv, gate_up; M = 1, 2).
Last, the fixed cost of one kernel in a CUDA graph: an empty kernel of 1 and of 1,024 programs,
launched 256 times in one graph (no L2 flush), the floor under every small kernel of a decode step.
A GPU run writes benchmarks/results/bench_gemv/<gpu>.{json,png} (``--out DIR``: DIR/bench_gemv.*).
"""
from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F

from l7_fast.fused_act import silu_mul
from l7_fast.fused_norm import add_rms_norm
from l7_fast.gemv import GEMV_MAX_M, gemv, gemv_config
from benchmarks.kernel_bench import CHECKS, Bench, fraction_equal
from benchmarks.outputs import output_stem
from benchmarks.timing import graph_ms
from plumbing.plot import pyplot, wrote

import triton


@triton.jit
def _empty_kernel(x_ptr):
    pass


def launch_floor_us(programs: int, n: int = 256) -> float:
    """GPU microseconds per launch of an empty kernel, n launches back to back in one CUDA graph."""
    x = torch.empty(1, device="cuda")

    def many():
        for _ in range(n):
            _empty_kernel[(programs,)](x)
    return graph_ms(many, reps=1) * 1e3 / n

#: (name, N outputs, K inputs, SwiGLU epilogue): one Qwen3-0.6B layer (hidden 1024, 16 q heads of 128)
SHAPES = (("qkv", 4096, 1024, False), ("o_proj", 1024, 2048, False), ("gate_up+SiLU", 3072, 1024, True),
          ("down", 1024, 3072, False))
MS = (1, 2, 4, 8, 16, 32)


def _case(M, N, K, silu, bias, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(2 * N if silu else N, K, generator=g) / math.sqrt(K)).to(device=device, dtype=dtype)
    b = torch.randn(N, generator=g).to(device=device, dtype=dtype) if bias else None
    ref = (lambda: silu_mul(F.linear(x, w))) if silu else (lambda: F.linear(x, w, b))
    return x, w, b, ref


def checks(device) -> bool:
    oks = []
    for dtype, tol in CHECKS:
        for M in (1, 3, 8):
            for N, K, silu, bias in ((200, 96, False, True), (96, 160, True, False)):
                x, w, b, ref = _case(M, N, K, silu, bias, dtype, device)
                out, r = gemv(x, w, b, silu_mul=silu), ref()
                ok = torch.allclose(out.float(), r.float(), atol=tol, rtol=tol)
                print(f"check {str(dtype):15s} M={M} {'gate_up+SiLU' if silu else 'plain+bias'} [{N}x{K}]  "
                      f"max|gemv - cuBLAS| = {(out.float() - r.float()).abs().max().item():.2e}  "
                      f"bit-equal {fraction_equal(out, r):.4f}  (atol=rtol={tol:g})  {'ok' if ok else 'FAIL'}")
                oks.append(ok)
    return all(oks)


def sweep(x, w, silu, nbytes, b: Bench) -> tuple:
    M = x.shape[0]
    times = {}
    for bn in (2, 4, 8, 16):
        for bk in (256, 512, 1024, 2048, 4096):
            for warps in (4, 8):
                if M * bn * bk // (32 * warps) > 256:          # > 256 float32 products per thread: spills
                    continue
                times[(bn, bk, warps)] = graph_ms(lambda c=(bn, bk, warps): gemv(x, w, silu_mul=silu, config=c))
    best = min(times, key=times.get)
    top = sorted(times, key=times.get)[:5]
    print(f"  sweep M={M}: best (BLOCK_N, BLOCK_K, warps) {best} {b.pct(nbytes, times[best]):.0f}% of copy; "
          f"gemv_config's {gemv_config(triton.next_power_of_2(M), w.shape[0] // (2 if silu else 1), x.shape[1])}; top 5: "
          + ", ".join(f"{c}: {b.pct(nbytes, times[c]):.0f}%" for c in top))
    return best, times[best]


def prologue_rows(b: Bench) -> None:
    """The add + RMSNorm in the GEMV's prologue (FusedOps' small steps) against the two kernels it
    replaces (fused_norm.add_rms_norm, then the GEMV): qkv and gate_up+SiLU, the two matmuls that
    read a norm, at M = 1, 2. ("torch" in the table is the two-kernel path here.)"""
    for name, N, K, silu in (SHAPES[0], SHAPES[2]):
        for M in range(1, GEMV_MAX_M + 1):
            x, w, _, _ = _case(M, N, K, silu, False, torch.bfloat16, "cuda")
            delta, h_out, nw = torch.randn_like(x), torch.empty_like(x), torch.ones(K, dtype=x.dtype, device="cuda")
            nbytes = w.numel() * 2 + 3 * M * K * 2 + M * N * 2
            two = lambda: gemv(add_rms_norm(delta, x, nw, 1e-6, residual_out=h_out)[0], w, silu_mul=silu)  # noqa: E731
            one = lambda: gemv(x, w, silu_mul=silu, norm_weight=nw, delta=delta, residual_out=h_out)  # noqa: E731
            r = b.row(f"norm+gemv {name}", f"{M}x{K} -> {N}", nbytes, one, two)
            r.update(name=f"prologue {name}", M=M, N=N, K=K)


def timings(do_sweep: bool, out: str | None) -> list:
    b, dtype = Bench(), torch.bfloat16
    print(f"bf16, L2 flushed before each call, CUDA-graph replay. FusedOps takes the GEMV for M <= {GEMV_MAX_M}.")
    best = {}
    for name, N, K, silu in SHAPES:
        for M in MS:
            x, w, _, ref = _case(M, N, K, silu, False, dtype, "cuda")
            nbytes = w.numel() * 2 + M * K * 2 + M * N * 2
            r = b.row(f"gemv {name}", f"{M}x{K} -> {N}", nbytes, lambda: gemv(x, w, silu_mul=silu), ref)
            r.update(name=name, M=M, N=N, K=K)
            if do_sweep and M in (1, 2):
                best[f"{name} M={M}"] = sweep(x, w, silu, nbytes, b)
    prologue_rows(b)
    floor = {p: launch_floor_us(p) for p in (1, 1024)}
    print("an empty kernel in a CUDA graph, 256 back to back: "
          + ", ".join(f"{p} program(s) {us:.2f} µs per launch" for p, us in floor.items()))
    stem = output_stem("bench_gemv", out, False, "cuda")
    with open(stem + ".json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, dtype="bfloat16",
                       empty_kernel_us=floor,
                       copy_GBps=b.copy_gbps, gemv_max_m=GEMV_MAX_M, rows=b.rows,
                       sweep_best={k: [list(c), ms] for k, (c, ms) in best.items()}), f, indent=1)
    plt = pyplot()
    if plt:
        fig, axes = plt.subplots(1, len(SHAPES), figsize=(4 * len(SHAPES), 3.4), sharey=True)
        for ax, (name, N, K, _) in zip(axes, SHAPES):
            rows = [r for r in b.rows if r["name"] == name]          # (not the prologue rows)
            ax.plot(MS, [r["pct_copy"] for r in rows], "o-", label="Triton GEMV")
            ax.plot(MS, [100 * r["bytes"] / r["torch_us"] / 1e3 / b.copy_gbps for r in rows], "s--", label="cuBLAS")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{name} [{K} -> {N}]")
            ax.set_xlabel("M (rows)")
        axes[0].set_ylabel("% of copy bandwidth")
        axes[0].legend()
        fig.suptitle(f"{torch.cuda.get_device_name()}, bf16: small-M matmul, GEMV vs cuBLAS")
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=110)
    print(wrote(stem + ".json", stem + ".png"))
    return b.rows
