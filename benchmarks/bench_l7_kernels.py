"""Stage 7's kernels, each checked against its torch reference and then timed (GPU), one at a time.

    python -m benchmarks.bench_l7_kernels --kernel norm    # add_rms_norm, rms_norm (fused_norm.py)
    python -m benchmarks.bench_l7_kernels --kernel act     # silu_mul (fused_act.py)
    python -m benchmarks.bench_l7_kernels --kernel rope    # qk_norm_rope_write (fused_rope.py)
    python -m benchmarks.bench_l7_kernels --kernel split   # split-KV decode vs stage 3 and SDPA
    python -m benchmarks.bench_l7_kernels --kernel gemv    # small-M matmul vs cuBLAS (gemv.py;
                                                           # benchmarks/bench_gemv.py; --gemv-sweep)
    python -m benchmarks.bench_l7_kernels                  # all five

Each prints one ``check`` line per dtype (float32, float16, and bfloat16 on a GPU: the interpreter
truncates bfloat16 casts), ending ``ok`` or ``FAIL``; on a GPU, then a table: kernel vs the torch
path it replaces vs copy bandwidth (benchmarks/timing.py says how each time is taken). On a
CPU only the checks run (through the Triton interpreter). A GPU run writes what it prints to
benchmarks/results/bench_l7_kernels/<gpu>.md (and gemv its figures to benchmarks/results/bench_gemv/).
"""
from __future__ import annotations

import argparse
import sys

from benchmarks.outputs import out_help

KERNELS = ("norm", "act", "rope", "split", "gemv")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=KERNELS, action="append", help="which kernel (repeatable; default all five)")
    p.add_argument("--gemv-sweep", action="store_true", help="gemv: also sweep (BLOCK_N, BLOCK_K, warps) at M = 1, 2")
    p.add_argument("--out", default=None, help=out_help("bench_l7_kernels") + "; gemv writes bench_gemv.* beside it")
    return p.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch  # noqa: E402
from dataclasses import replace  # noqa: E402

from plumbing.runtime import INTERPRET  # noqa: E402  (before triton: picks GPU or interpreter)
import benchmarks.attention_peers as ba  # noqa: E402
from l1_dense.config import PRESETS  # noqa: E402
from l1_dense.model import RMSNorm  # noqa: E402
from l3_paged.attention_ref import paged_attention_ref  # noqa: E402
from l3_paged.attention_triton import paged_attention_triton  # noqa: E402
from l3_paged.kernel_config import KernelConfig  # noqa: E402
from l3_paged.paged_batch import make_paged_batch  # noqa: E402
from l7_fast.attention_split import _num_sms, paged_attention_split, pick_num_splits  # noqa: E402
from l7_fast.fused_act import silu_mul, silu_mul_ref  # noqa: E402
from l7_fast.fused_norm import add_rms_norm, add_rms_norm_ref, rms_norm  # noqa: E402
from l7_fast.fused_rope import qk_norm_rope_write, qk_norm_rope_write_ref, rope_case  # noqa: E402
from l7_fast.pdl import pdl_supported  # noqa: E402
from benchmarks.kernel_bench import CHECKS, Bench, fraction_equal  # noqa: E402
from benchmarks.outputs import output_stem  # noqa: E402
from benchmarks.timing import graph_ms, host_us, try_graph_ms  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import wrote  # noqa: E402


def norm(device: str) -> bool:
    """The checks (True if every one is ok), then the timings on a GPU."""
    oks = []
    N = PRESETS["Qwen/Qwen3-0.6B"].hidden_size
    for dtype, tol in CHECKS:
        norm = RMSNorm(N, 1e-6).to(device=device, dtype=dtype).requires_grad_(False)
        norm.weight.copy_(torch.randn(N, device=device))
        x, res = (torch.randn(37, N, device=device).to(dtype) for _ in range(2))
        out, h = add_rms_norm(x, res, norm.weight, norm.eps)
        ref, h_ref = add_rms_norm_ref(x, res, norm)
        plain = rms_norm(x, norm.weight, norm.eps)
        ok = (torch.equal(h, h_ref) and torch.allclose(out, ref, atol=tol, rtol=tol)
              and torch.allclose(plain, norm(x), atol=tol, rtol=tol))
        print(f"check {str(dtype):15s} residual exact: {torch.equal(h, h_ref)}  max|out - ref| = "
              f"{(out.float() - ref.float()).abs().max().item():.2e}  bit-equal {fraction_equal(out, ref):.4f}  "
              f"(atol=rtol={tol:g})  {'ok' if ok else 'FAIL'}")
        oks.append(ok)
    if device == "cuda":
        b, dtype = Bench(), torch.bfloat16
        norm = RMSNorm(N, 1e-6).to(device=device, dtype=dtype).requires_grad_(False)
        for M in (1, 64, 4096):
            x, res, o, h = (torch.randn(M, N, device=device, dtype=dtype) for _ in range(4))
            b.row("add_rms_norm", f"{M}x{N} bf16", (4 * M * N + N) * 2,
                  lambda: add_rms_norm(x, res, norm.weight, norm.eps, out=o, residual_out=h),
                  lambda: add_rms_norm_ref(x, res, norm))
            b.row("rms_norm", f"{M}x{N} bf16", (2 * M * N + N) * 2,
                  lambda: rms_norm(x, norm.weight, norm.eps), lambda: norm(x))
    return all(oks)


def act(device: str) -> bool:
    """The checks (True if every one is ok), then the timings on a GPU."""
    oks = []
    inter = PRESETS["Qwen/Qwen3-0.6B"].intermediate_size
    for dtype, tol in CHECKS:
        x = (4 * torch.randn(37, 2 * inter, device=device)).to(dtype)
        out, ref = silu_mul(x), silu_mul_ref(x)
        ok = torch.allclose(out, ref, atol=tol, rtol=tol)
        print(f"check {str(dtype):15s} max|out - ref| = {(out.float() - ref.float()).abs().max().item():.2e}  "
              f"bit-equal {fraction_equal(out, ref):.4f}  (atol=rtol={tol:g})  {'ok' if ok else 'FAIL'}")
        oks.append(ok)
    if device == "cuda":
        b = Bench()
        for M in (1, 64, 4096):
            x = torch.randn(M, 2 * inter, device=device, dtype=torch.bfloat16)
            o = torch.empty(M, inter, device=device, dtype=torch.bfloat16)
            b.row("silu_mul", f"{M}x{inter} bf16", 3 * M * inter * 2, lambda: silu_mul(x, out=o),
                  lambda: silu_mul_ref(x))
    return all(oks)


def rope(device: str) -> bool:
    """The checks (True if every one is ok), then the timings on a GPU."""
    oks = []
    cfg = replace(PRESETS["Qwen/Qwen3-0.6B"], num_layers=1)
    for dtype, tol in CHECKS:
        attn, (q, k, v, cos, sin), (kv, kv_ref), slots = rope_case(cfg, 37, device, dtype, num_blocks=8)
        norm = dict(q_norm_weight=attn.q_norm.weight, k_norm_weight=attn.k_norm.weight, eps=attn.q_norm.eps)
        out = qk_norm_rope_write(q, k, v, cos, sin, kv.K[0], kv.V[0], slots, **norm)
        ref = qk_norm_rope_write_ref(attn, q, k, v, cos, sin, kv_ref, slots)
        flat = (-1, cfg.num_kv_heads, cfg.head_dim)
        k_w, k_ref = kv.K[0].view(flat)[slots], kv_ref.K[0].view(flat)[slots]
        ok = (torch.allclose(out, ref, atol=tol, rtol=tol) and torch.allclose(k_w, k_ref, atol=tol, rtol=tol)
              and torch.equal(kv.V[0].view(flat)[slots], v))
        print(f"check {str(dtype):15s} max|q - ref| = {(out.float() - ref.float()).abs().max().item():.2e}  "
              f"max|k - ref| = {(k_w.float() - k_ref.float()).abs().max().item():.2e}  bit-equal q "
              f"{fraction_equal(out, ref):.4f} k {fraction_equal(k_w, k_ref):.4f}  (atol=rtol={tol:g})  "
              f"{'ok' if ok else 'FAIL'}")
        oks.append(ok)
    if device == "cuda":
        b, dtype = Bench(), torch.bfloat16
        for T in (1, 64, 4096):
            attn, (q, k, v, cos, sin), (kv, kv_ref), slots = rope_case(cfg, T, device, dtype, num_blocks=T // 16 + 1)
            norm = dict(q_norm_weight=attn.q_norm.weight, k_norm_weight=attn.k_norm.weight, eps=attn.q_norm.eps)
            qo = torch.empty_like(q)
            nbytes = 2 * T * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim * 2 + 2 * T * cfg.head_dim * 2
            b.row("qk_norm_rope_write", f"T={T} H 16/8 D 128 bf16", nbytes,
                  lambda: qk_norm_rope_write(q, k, v, cos, sin, kv.K[0], kv.V[0], slots, q_out=qo, **norm),
                  lambda: qk_norm_rope_write_ref(attn, q, k, v, cos, sin, kv_ref, slots))
    return all(oks)


def split(device: str) -> bool:
    """The checks (True if every one is ok), then the timings on a GPU."""
    oks = []
    kv_lens = [700, 5, 130, 1]               # several splits, uneven last split, shorter than a split
    for dtype, tol in CHECKS:
        tol = 2e-3 if dtype == torch.float16 else tol     # p is rounded to fp16 before p @ v (as stage 3)
        args = make_paged_batch([1] * 4, kv_lens, 8, 2, 64, 16, dtype, device)
        ref = paged_attention_ref(*args)
        for n in (3, 8):
            out = paged_attention_split(*args, max_seqlen_q=1, num_splits=n,
                                        config=KernelConfig(1, 32, 4, 2) if INTERPRET else None)
            ok = torch.allclose(out, ref, atol=tol, rtol=tol)
            print(f"check {str(dtype):15s} splits={n}  max|split - ref| = {(out.float() - ref.float()).abs().max():.2e}"
                  f"  (atol=rtol={tol:g})  {'ok' if ok else 'FAIL'}")
            oks.append(ok)
    if device != "cuda":
        return all(oks)
    cfg, dtype, bs = PRESETS["Qwen/Qwen3-0.6B"], torch.bfloat16, 16
    H_q, H_kv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    assert (ba.H_KV, ba.D, ba.BLOCK_SIZE) == (H_kv, D, bs), "dense_kv gathers with stage 3's bench shape"
    b, sms = Bench(), _num_sms(torch.device("cuda", torch.cuda.current_device()))
    print(f"decode, Qwen3-0.6B heads (H_q {H_q}, H_kv {H_kv}, D {D}), bf16, block_size {bs}, {sms} SMs. "
          "% = of copy bandwidth; graph = GPU time from CUDA-graph replay (L2 flushed), eager = do_bench")
    print("| batch x ctx | splits (auto) | split µs graph | split % | split µs eager | split host µs | l3 µs graph "
          "| l3 % | l3 µs eager | SDPA µs graph | SDPA % | SDPA µs eager | split vs l3 | split vs SDPA "
          "| split pass alone µs graph (merge skipped) | its % | split + merge with PDL µs graph | PDL vs SDPA |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for B, ctx in ISSUE_18_SHAPES:
        args = make_paged_batch([1] * B, [ctx] * B, H_q, H_kv, D, bs, dtype, device, spare_blocks=0)
        nbytes = 2 * B * ctx * H_kv * D * 2 + 2 * B * H_q * D * 2          # K/V read, q read, out written
        auto = pick_num_splits(B, H_kv, ctx, sms)
        err = (paged_attention_split(*args, max_seqlen_q=1, max_seqlen_kv=ctx).float()
               - paged_attention_triton(*args, max_seqlen_q=1).float()).abs().max().item()
        k, v = ba.dense_kv(args, ctx)                                       # [B, H_kv, ctx, D]
        qd = args[0].view(B, H_q, 1, D)
        fns = dict(split=lambda: paged_attention_split(*args, max_seqlen_q=1, max_seqlen_kv=ctx),
                   l3=lambda: paged_attention_triton(*args, max_seqlen_q=1),
                   sdpa=lambda: ba.sdpa(qd, k, v, False))
        g = {name: try_graph_ms(fn) for name, fn in fns.items()}
        e = {name: b.eager(fn) for name, fn in fns.items()}
        us = {name: f"{g[name] * 1e3:.1f} | {b.pct(nbytes, g[name]):.0f}% | {e[name] * 1e3:.1f}" for name in g}
        alone = split_pass_alone_ms(fns["split"]) if auto > 1 else None
        pdl = pdl_supported(args[0].device) and auto > 1           # split and merge chained (pdl.py)
        t_pdl = try_graph_ms(lambda: paged_attention_split(*args, max_seqlen_q=1, max_seqlen_kv=ctx, pdl=True)) \
            if pdl else None
        print(f"| {B} x {ctx} | {auto} | {us['split']} | {host_us(fns['split']):.0f} | {us['l3']} | {us['sdpa']} | "
              f"{g['l3'] / g['split']:.2f}x | {g['sdpa'] / g['split']:.2f}x | "
              + (f"{alone * 1e3:.1f} | {b.pct(nbytes, alone):.0f}% |" if alone else "- (one split: no merge) | - |")
              + (f" {t_pdl * 1e3:.1f} | {g['sdpa'] / t_pdl:.2f}x |" if t_pdl else " - | - |")
              + f"   (max|split - l3| {err:.1e})")
        split_sweep(b, args, ctx, nbytes)
        del args, k, v
    return all(oks)


def split_sweep(b, args, ctx, nbytes) -> None:
    """Print the split kernel's graph time, as % of copy bandwidth, for each (splits, tile) tried."""
    sweep = {}                                     # (splits, block_n, warps, stages) -> graph ms
    for bn, w, st in ((32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (128, 4, 2)):
        for n in (4, 8, 16, 32, 64, 128):
            if n * bn <= ctx:
                c = KernelConfig(1, bn, w, st)
                sweep[(n, bn, w, st)] = graph_ms(
                    lambda: paged_attention_split(*args, max_seqlen_q=1, num_splits=n, config=c))
    best = min(sweep, key=sweep.get)
    print(f"  sweep (graph, % of copy), best {best}: {b.pct(nbytes, sweep[best]):.0f}%: "
          + ", ".join(f"{key}: {b.pct(nbytes, ms):.0f}" for key, ms in sweep.items()))


#: issue 18's decode shapes (batch, context), Qwen3-0.6B heads
ISSUE_18_SHAPES = ((1, 4096), (1, 32768), (8, 8192), (32, 4096), (64, 4096), (256, 1024))


def split_pass_alone_ms(fn) -> float:
    """The split kernel's graph time with the merge launch replaced by nothing: what the second
    kernel costs is the difference (a measurement only; the output is not read)."""
    import l7_fast.attention_split as attention_split
    merge = attention_split._merge
    attention_split._merge = lambda *args, **kw: None
    try:
        return try_graph_ms(fn)
    finally:
        attention_split._merge = merge


def gemv(device: str, a) -> bool:
    """The checks (True if every one is ok), then the timings on a GPU (benchmarks/bench_gemv.py)."""
    import benchmarks.bench_gemv as bg
    ok = bg.checks(device)
    if device == "cuda":
        bg.timings(a.gemv_sweep, a.out)
    elif a.gemv_sweep:
        print("--gemv-sweep ignored: no GPU (only the checks run on a CPU)")
    return ok


def main(argv=None) -> int:
    a = parse(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    run = dict(norm=norm, act=act, rope=rope, split=split, gemv=lambda d: gemv(d, a))
    if a.kernel and "gemv" not in a.kernel and a.gemv_sweep:
        print("note: --gemv-sweep is ignored without --kernel gemv (only gemv uses it)")
    failed, tee = [], Tee(sys.stdout) if device == "cuda" else None
    sys.stdout = tee or sys.stdout
    try:
        for k in a.kernel or KERNELS:
            print(f"== {k}")
            if not run[k](device):
                failed.append(k)
        print(f"checks: {'FAIL in ' + ', '.join(failed) if failed else 'all ok'}")
    finally:
        sys.stdout = tee.stream if tee else sys.stdout
    if tee:                                   # a GPU run keeps what it printed: the tables are its result
        stem = output_stem("bench_l7_kernels", a.out, False, device)
        with open(stem + ".md", "w") as f:
            f.write(f"# bench_l7_kernels --kernel {','.join(a.kernel or KERNELS)}\n\n```text\n{''.join(tee.parts)}```\n")
        print(wrote(stem + ".md"))
    return 1 if failed else 0


class Tee:
    """stdout, and a copy of everything written to it."""

    def __init__(self, stream):
        self.stream, self.parts = stream, []

    def write(self, text):
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
