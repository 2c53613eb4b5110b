"""Programmatic dependent launch (l7_fast/pdl.py, lesson 7.9): a single-stream decode step's
kernel chain with and without PDL, in a CUDA graph, on a Hopper GPU.

    python -m benchmarks.bench_pdl              # a Hopper GPU; elsewhere it says so and exits

Chains, Qwen3-0.6B's shapes (hidden 1,024, 16 q heads and 8 kv heads of 128, MLP 3,072), 28 layers:
  * gemvs: the four GEMVs of each layer (qkv with the norm in its prologue, o_proj, gate/up + SiLU
    with the residual add and norm, down), M = 1 and 2: the bytes are the weights;
  * gemvs + breaker: the same with an elementwise torch kernel (launched without PDL) after each
    qkv GEMV, where the attention kernels sit in the real step;
  * layers: the whole decode layer of the fused path (qkv GEMV, rope + K/V write, split-KV and its
    merge over a 768-token context, o_proj GEMV, gate/up GEMV, down GEMV), M = 1.
Each chain is captured once with pdl=False and once with pdl=True; the outputs must be equal bit
for bit before anything is timed. GPU time per replay, L2 flushed before each (timing.py).
Writes benchmarks/results/bench_pdl/<gpu>.{json,png} (``--out DIR``: DIR/bench_pdl.*).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("bench_pdl"))
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch  # noqa: E402

import plumbing.runtime  # noqa: E402,F401  (before triton: picks GPU or interpreter)
from benchmarks.kernel_bench import Bench  # noqa: E402
from benchmarks.outputs import output_stem  # noqa: E402
from benchmarks.timing import graph_ms  # noqa: E402
from l3_paged.paged_batch import make_paged_batch  # noqa: E402
from l7_fast.attention_split import paged_attention_split  # noqa: E402
from l7_fast.fused_rope import qk_norm_rope_write  # noqa: E402
from l7_fast.gemv import gemv  # noqa: E402
from l7_fast.pdl import pdl_supported  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import pyplot, wrote  # noqa: E402

L, H, H_Q, H_KV, D, I, CTX = 28, 1024, 16, 8, 128, 3072, 768


def weights(dev, dt):
    g = torch.Generator(device=dev).manual_seed(0)
    r = lambda *s: (torch.randn(*s, device=dev, generator=g) * 0.02).to(dt)    # noqa: E731
    one = lambda n: (torch.rand(n, device=dev, generator=g) + 0.5).to(dt)      # noqa: E731
    return [dict(qkv=r(H_Q * D + 2 * H_KV * D, H), o=r(H, H_Q * D), gu=r(2 * I, H), down=r(H, I),
                 n1=one(H), n2=one(H), qn=one(D), kn=one(D)) for _ in range(L)]


def make_chain(kind, W, M, dev, dt):
    """fn(pdl) -> the chain's output, over static buffers."""
    h0 = torch.randn(M, H, device=dev).to(dt)
    _, kc, vc, cu, kv, bt = make_paged_batch([1], [CTX], H_Q, H_KV, D, 16, dt, dev)
    caches = {p: (kc.clone(), vc.clone()) for p in (False, True)}     # each variant writes its own
    slot = (bt[0, (CTX - 1) // 16].long() * 16 + (CTX - 1) % 16).view(1)
    ang = (CTX - 1) / 10000 ** (torch.arange(0, D, 2, device=dev) / D)
    cos, sin = torch.cat([ang.cos()] * 2).to(dt)[None], torch.cat([ang.sin()] * 2).to(dt)[None]

    def fn(pdl):
        h, d = h0, None
        for lw in W:
            kw = dict(norm_weight=lw["n1"], pdl=pdl)
            if d is not None:
                h2 = torch.empty_like(h)
                kw.update(delta=d, residual_out=h2)
            qkv = gemv(h, lw["qkv"], **kw)
            h = h2 if d is not None else h
            q, k, v = qkv.split([H_Q * D, H_KV * D, H_KV * D], -1)
            if kind == "layers":
                q = qk_norm_rope_write(q.view(1, H_Q, D), k.view(1, H_KV, D), v.view(1, H_KV, D), cos, sin,
                                       *caches[pdl], slot, q_norm_weight=lw["qn"], k_norm_weight=lw["kn"], pdl=pdl)
                a = paged_attention_split(q, *caches[pdl], cu, kv, bt, max_seqlen_q=1, num_splits=12,
                                          check=False, pdl=pdl).view(1, H_Q * D)
            else:
                a = q * 1.0 if kind == "gemvs + breaker" else q
            d = gemv(a, lw["o"], pdl=pdl)
            h2 = torch.empty_like(h)
            act = gemv(h, lw["gu"], silu_mul=True, norm_weight=lw["n2"], delta=d, residual_out=h2, pdl=pdl)
            h = h2
            d = gemv(act, lw["down"], pdl=pdl)
        return h + d
    return fn


def main(argv=None):
    a = parse(argv)
    if not (torch.cuda.is_available() and pdl_supported(torch.device("cuda"))):
        print("bench_pdl: needs a Hopper (sm_90) or newer GPU; nothing to measure here")
        return 0
    t0, dev, dt = time.perf_counter(), "cuda", torch.bfloat16
    stem = output_stem("bench_pdl", a.out, False, dev)
    b, W = Bench(), weights(dev, dt)
    wbytes = sum(w.numel() * 2 for lw in W for k, w in lw.items() if k in ("qkv", "o", "gu", "down"))
    print(f"{torch.cuda.get_device_name()}, bf16, {L} layers of Qwen3-0.6B; copy bandwidth {b.copy_gbps:.0f} GB/s; "
          f"weights {wbytes / 1e6:.0f} MB")
    print("| chain | M | kernels | without PDL ms | GB/s | with PDL ms | GB/s | speed-up | outputs equal |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    rows = []
    for kind, M, kernels in (("gemvs", 1, 4), ("gemvs", 2, 4), ("gemvs + breaker", 1, 5), ("layers", 1, 7)):
        fn = make_chain(kind, W, M, dev, dt)
        same = torch.equal(fn(False), fn(True))
        if not same:
            print(f"| {kind} | {M} | FAIL: the PDL chain's output differs; not timed |")
            rows.append(dict(chain=kind, M=M, equal=False))
            continue
        ms = {p: graph_ms(lambda p=p: fn(p)) for p in (False, True)}
        gbs = {p: wbytes / ms[p] / 1e6 for p in ms}
        rows.append(dict(chain=kind, M=M, kernels_per_layer=kernels, ms_plain=ms[False], ms_pdl=ms[True],
                         gbps_plain=gbs[False], gbps_pdl=gbs[True], equal=same))
        print(f"| {kind} | {M} | {kernels * L} | {ms[False]:.3f} | {gbs[False]:.0f} | {ms[True]:.3f} | {gbs[True]:.0f} "
              f"| {ms[False] / ms[True]:.2f}x | {same} |", flush=True)
    with open(stem + ".json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, dtype="bfloat16",
                       copy_GBps=b.copy_gbps, weights_bytes=wbytes, context=CTX, rows=rows), f, indent=1)
    plt = pyplot()
    if plt is not None:
        ok = [r for r in rows if r["equal"]]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        xs = range(len(ok))
        ax.bar([x - 0.2 for x in xs], [r["ms_plain"] for r in ok], 0.4, label="without PDL")
        ax.bar([x + 0.2 for x in xs], [r["ms_pdl"] for r in ok], 0.4, label="with PDL")
        ax.set_xticks(list(xs), [f"{r['chain']}\nM={r['M']}" for r in ok])
        ax.set_ylabel("ms per chain (GPU, CUDA graph)")
        ax.set_title(f"28 layers, {torch.cuda.get_device_name()}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=110)
    print(wrote(stem + ".json", stem + ".png") + f"; {time.perf_counter() - t0:.0f} s")
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
