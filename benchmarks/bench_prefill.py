"""Prefill attention: where stage 3's kernel stands against cuDNN, and what Triton reaches here.

    python -m benchmarks.bench_prefill            # GPU: the study (about 4 minutes cold)
    python -m benchmarks.bench_prefill --quick    # CPU: smoke-test the script (float16)

One causal prompt of T tokens, Qwen3-8B's attention (H_q 32, H_kv 8, D 128), bf16. Measured in
the same run, each checked against SDPA before it is timed:

  sdpa            torch SDPA on dense [1, H, T, D] (cuDNN on Hopper): the peer
  stage3 b16      stage 3's kernel on the engine's cache (block 16), pick_config's tile
  stage3 sweep    the same kernel and cache, every candidate tile (the best is reported)
  stage3 bT       the same kernel with one cache block per sequence: what paging costs it
  tma b64/b128/bT studies/prefill_tma.py: each key tile one TMA load, blocks of 64, 128 or T tokens,
                  swept over tiles, pipelining depth and warp specialisation

Scored in TFLOP/s (4 * H_q * D * T(T+1)/2 flops) and as a fraction of SDPA and of the bf16
matmul rate measured here. A GPU run writes benchmarks/results/bench_prefill/<gpu>.{json,md,png};
--quick writes under out/.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("bench_prefill"))
    ap.add_argument("--quick", action="store_true", help="tiny shapes in float16: smoke-test the script (CPU ok)")
    ap.add_argument("--lengths", default=None, help="prompt lengths, comma-separated (default 4096,16384; "
                    "ignored with --quick, which runs 64,128)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch  # noqa: E402

import l3_paged  # noqa: E402,F401  (before triton: picks GPU or interpreter)
import triton  # noqa: E402
from benchmarks.attention_peers import dense_kv, sdpa  # noqa: E402
from benchmarks.bench_common import bench_device, ceilings  # noqa: E402
from benchmarks.outputs import output_stem  # noqa: E402
from benchmarks.studies.prefill_tma import prefill_tma  # noqa: E402
from benchmarks.timing import timer  # noqa: E402
from l3_paged.attention_triton import paged_attention_triton  # noqa: E402
from l3_paged.kernel_config import KernelConfig, pick_config  # noqa: E402
from l3_paged.paged_batch import make_paged_batch  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import pyplot, wrote  # noqa: E402

H_Q, H_KV, D = 32, 8, 128
STAGE3_TILES = [KernelConfig(bq, bn, w, st) for bq, bn, w, st in itertools.product((32, 64), (32, 64, 128), (8,), (2, 3, 4))
                if not (bq == 64 and bn == 128)] + [KernelConfig(32, 64, 4, 2), KernelConfig(32, 64, 4, 3)]
TMA_TILES = [dict(block_m=bm, block_n=bn, num_warps=w, num_stages=st, warp_spec=ws)
             for bm, bn, w, st, ws in itertools.product((64, 128), (64, 128), (4, 8), (2, 3, 4), (False, True))
             if not (bm == 64 and w == 8) and bm % bn == 0]


def checked_ms(bench, fn, ref, tol):
    """Time fn if its output matches ref within tol; None (and why) if it fails to build or check."""
    try:
        err = (fn().float() - ref).abs().max().item()
        if not err <= tol:
            print(f"    CHECK FAILED: max|out - sdpa| = {err:.3g} > {tol}")
            return None, err
        return bench(fn), err
    except Exception as e:  # noqa: BLE001  (a config the compiler refuses is a result, not a crash)
        print(f"    failed: {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}")
        return None, None


def fastest(rows, name, k=4):
    """The k fastest configs of one variant in an earlier length's rows (later lengths time only these)."""
    done = sorted((r for r in rows if r["name"] == name and r["ms"] is not None), key=lambda r: r["ms"])
    return [r["config"] for r in done[:k]]


def one_length(bench, device, T, dtype, tol, quick, prior=None):
    flops = 4 * H_Q * D * T * (T + 1) // 2
    layouts = {bs: make_paged_batch([T], [T], H_Q, H_KV, D, bs, dtype, device, spare_blocks=0)
               for bs in (16, 64, 128, T)}
    q = layouts[16][0]
    kt, vt = dense_kv(layouts[16], T)                                                   # [1, H_kv, T, D]
    # The same q and K/V values in every layout: the block-16 cache's keys written into the others.
    j = torch.arange(T, device=device)
    for bs, args in layouts.items():
        slots = args[5][0, j // bs].long() * bs + j % bs
        args[1].view(-1, H_KV, D)[slots] = kt[0].transpose(0, 1)
        args[2].view(-1, H_KV, D)[slots] = vt[0].transpose(0, 1)
        layouts[bs] = (q,) + args[1:]
    qd = q.view(1, T, H_Q, D).transpose(1, 2).contiguous()
    ref = sdpa(qd.float(), kt.float(), vt.float(), True).transpose(1, 2)[0]             # [T, H_q, D] fp32
    rows = []

    def add(name, fn, cfg=None):
        ms, err = checked_ms(bench, fn, ref, tol)
        rows.append(dict(T=T, name=name, config=cfg, ms=ms, max_err=err,
                         tflops=None if ms is None else flops / ms / 1e9))
        print(f"  T={T:6d} {name:12s} {str(cfg or ''):70s} "
              f"{'   -   ' if ms is None else f'{ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s'}")

    add("sdpa", lambda: sdpa(qd, kt, vt, True).transpose(1, 2)[0])
    if device == "cuda":            # which backend SDPA's default picked: time each one forced
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for label, backend in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa flash", SDPBackend.FLASH_ATTENTION)):
            def forced(backend=backend):
                with sdpa_kernel(backend):
                    return sdpa(qd, kt, vt, True).transpose(1, 2)[0]
            add(label, forced)
    add("stage3 b16", lambda: paged_attention_triton(*layouts[16], max_seqlen_q=T))
    add("stage3 bT", lambda: paged_attention_triton(*layouts[T], max_seqlen_q=T))
    tiles = [c.__dict__ for c in (STAGE3_TILES[:2] if quick else STAGE3_TILES)]
    for cfg in fastest(prior, "stage3 sweep") if prior else tiles:
        add("stage3 sweep", lambda: paged_attention_triton(*layouts[16], max_seqlen_q=T, config=KernelConfig(**cfg)),
            cfg)
    tma_tiles = [dict(block_m=16, block_n=16, num_warps=4, num_stages=1, warp_spec=False)] if quick else TMA_TILES
    for bs in ((T,) if quick else (T, 128, 64)):
        label = f"tma b{'T' if bs == T else bs}"
        for cfg in fastest(prior, label) if prior else tma_tiles:
            if bs % cfg["block_n"] == 0:
                add(label, lambda: prefill_tma(q, *layouts[bs][1:3], layouts[bs][5], **cfg),
                    cfg)
    return dict(T=T, flops=flops, default_config=pick_config(T, T, 1, 4, D, dtype).__dict__, rows=rows)


def summary(results, matmul_tf):
    best = {}
    for case in results:
        for r in case["rows"]:
            key = (r["T"], r["name"])
            if r["ms"] is not None and (key not in best or r["ms"] < best[key]["ms"]):
                best[key] = r
    lines = ["| T | variant | best config | ms | TFLOP/s | × SDPA | % of bf16 matmul rate |",
             "|---:|---|---|---:|---:|---:|---:|"]
    for case in results:
        sd = best.get((case["T"], "sdpa"))
        for (T, name), r in best.items():
            if T != case["T"]:
                continue
            cfg = "" if r["config"] is None else " ".join(f"{k}={v}" for k, v in r["config"].items())
            ratio = f"{sd['ms'] / r['ms']:.2f}" if sd else "n/a"
            pct = f"{100 * r['tflops'] / matmul_tf:.0f}%" if matmul_tf else "n/a"
            lines.append(f"| {T} | {name} | {cfg} | {r['ms']:.3f} | {r['tflops']:.0f} | {ratio} | {pct} |")
    return "\n".join(lines), best


def plot(path, best, title):
    plt = pyplot()
    if plt is None:
        return
    Ts = sorted({T for T, _ in best})
    names = sorted({n for _, n in best}, key=lambda n: (n != "sdpa", n))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar([x + i * w for x in range(len(Ts))], [best[(T, n)]["tflops"] if (T, n) in best else 0 for T in Ts],
               w, label=n)
    ax.set_xticks([x + 0.4 - w / 2 for x in range(len(Ts))], [f"T={T}" for T in Ts])
    ax.set_ylabel("TFLOP/s (best config)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    a = parse(argv)
    t0 = time.perf_counter()
    device = bench_device(a.quick)
    stem = output_stem("bench_prefill", a.out, a.quick, device)
    bench = timer(device)
    dtype, tol = (torch.float16, 2e-3) if a.quick else (torch.bfloat16, 2e-2)
    if a.quick and a.lengths:
        print(f"NOTE: --lengths {a.lengths} ignored with --quick (it runs T = 64, 128)")
    lengths = [64, 128] if a.quick else [int(x) for x in (a.lengths or "4096,16384").split(",")]
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter: NOT performance)"
    _, matmul_tf = ceilings(device)
    meta = dict(device=name, torch=torch.__version__, triton=triton.__version__, dtype=str(dtype),
                shape=f"H_q={H_Q} H_kv={H_KV} D={D}, causal, one sequence", matmul_TFLOPs=matmul_tf)
    rate = f"{matmul_tf:.0f} TFLOP/s" if matmul_tf else "not measured (CPU)"
    print(f"{name}: bf16 matmul rate {rate}; {meta['shape']}, {dtype}")
    results = []
    for T in lengths:             # the first length sweeps every config; later ones its 4 fastest per variant
        results.append(one_length(bench, device, T, dtype, tol, a.quick, results[0]["rows"] if results else None))
    md, best = summary(results, matmul_tf)
    md = (f"Device: {name}; torch {meta['torch']}, triton {meta['triton']}; {meta['shape']}; {dtype}; "
          f"bf16 matmul rate measured here: {rate}.\n\n" + md)
    print("\n" + md)
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(md + "\n")
    plot(stem + ".png", best, f"{name}, {meta['shape']}, {dtype}")
    print(wrote(stem + ".json", stem + ".md", stem + ".png") + f" in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    run_main(main)
