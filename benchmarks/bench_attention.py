"""Benchmark the stage-3 paged-attention kernel against its peers, measured in the same run.

    python -m benchmarks.bench_attention                 # GPU: full sweep
    python -m benchmarks.bench_attention --quick         # CPU smoke test of the script
    python -m benchmarks.bench_attention --tune          # GPU: time kernel configs too

Shape: Qwen3-8B attention (H_q 32, H_kv 8, D 128), bfloat16, block_size 16, shuffled block table.
Peers: Path A (the reference), torch SDPA and FlexAttention (compiled) on the same data laid out
densely [B, H, T, D]. Decode is memory-bound, so it is scored in GB/s against a device-to-device
copy measured here; prefill is compute-bound, so it is scored in TFLOP/s and against SDPA.
A GPU run writes benchmarks/results/bench_attention/<gpu>.{json,md,png}; --quick writes under out/.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("bench_attention"))
    ap.add_argument("--quick", action="store_true", help="tiny shapes: smoke-test the script (CPU ok)")
    ap.add_argument("--tune", action="store_true", help="also time candidate kernel configs")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compiles are slow)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch

import l3_paged  # noqa: E402,F401  (before triton: picks GPU or interpreter)
import triton  # noqa: E402
from benchmarks.attention_peers import (BLOCK_SIZE, D, DTYPE, ELT, H_KV, H_Q, dense_kv, make_flex,  # noqa: E402
                                        sdpa, try_time)
from benchmarks.bench_attention_report import markdown, plot  # noqa: E402
from benchmarks.bench_common import bench_device  # noqa: E402
from benchmarks.outputs import output_stem  # noqa: E402
from benchmarks.timing import copy_bandwidth, timer  # noqa: E402
from l3_paged.attention_ref import paged_attention_ref  # noqa: E402
from l3_paged.attention_triton import paged_attention_triton  # noqa: E402
from l3_paged.kernel_config import KernelConfig  # noqa: E402
from l3_paged.paged_batch import make_paged_batch  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import wrote  # noqa: E402

def bench_decode(bench, device, batches, contexts, flex, ref_max_batch):
    rows = []
    for B in batches:
        for ctx in contexts:
            args = make_paged_batch([1] * B, [ctx] * B, H_Q, H_KV, D, BLOCK_SIZE, DTYPE, device, spare_blocks=0)
            q = args[0]
            nbytes = 2 * B * ctx * H_KV * D * ELT + 2 * B * H_Q * D * ELT   # K+V read, q read, out written
            row = dict(B=B, ctx=ctx, bytes=nbytes)
            row["triton_ms"] = bench(lambda: paged_attention_triton(*args, max_seqlen_q=1))
            k, v = dense_kv(args, ctx)                                         # [B, H_kv, ctx, D]
            qd = q.view(B, H_Q, 1, D)                                          # [B, H_q, 1, D]
            row["sdpa_ms"] = try_time(bench, lambda: (lambda: sdpa(qd, k, v, False)))
            # flex compiles once per shape (slow): only at the longest context
            row["flex_ms"] = try_time(bench, lambda: flex(qd, k, v, False)) if flex and ctx == contexts[-1] else None
            row["ref_ms"] = (try_time(bench, lambda: (lambda: paged_attention_ref(*args)), rep=30)
                             if B <= ref_max_batch else None)
            rows.append(row)
            print(f"decode B={B:3d} ctx={ctx:5d}: triton {row['triton_ms'] * 1e3:8.1f} us  "
                  f"{nbytes / row['triton_ms'] / 1e6:7.0f} GB/s")
            del args, k, v
    return rows


def bench_prefill(bench, device, lengths, flex):
    rows = []
    for T in lengths:
        args = make_paged_batch([T], [T], H_Q, H_KV, D, BLOCK_SIZE, DTYPE, device, spare_blocks=0)
        flops = 4 * H_Q * D * T * (T + 1) // 2        # 2 matmuls x 2 flop x visible (q, k) pairs
        row = dict(T=T, flops=flops)
        row["triton_ms"] = bench(lambda: paged_attention_triton(*args, max_seqlen_q=T))
        k, v = dense_kv(args, T)
        qd = args[0].view(1, T, H_Q, D).transpose(1, 2).contiguous()           # [1, H_q, T, D]
        row["sdpa_ms"] = try_time(bench, lambda: (lambda: sdpa(qd, k, v, True)))
        row["flex_ms"] = try_time(bench, lambda: flex(qd, k, v, True)) if flex else None
        row["ref_ms"] = try_time(bench, lambda: (lambda: paged_attention_ref(*args)), rep=30)
        rows.append(row)
        print(f"prefill T={T}: triton {row['triton_ms']:.3f} ms {flops / row['triton_ms'] / 1e9:.0f} TFLOP/s")
    return rows


def bench_mixed(bench, device, B, ctx, chunk):
    """One launch: a prefill chunk of `chunk` tokens on cached context plus B-1 decodes."""
    q_lens, kv_lens = [chunk] + [1] * (B - 1), [ctx] * B
    args = make_paged_batch(q_lens, kv_lens, H_Q, H_KV, D, BLOCK_SIZE, DTYPE, device, spare_blocks=0)
    ms = bench(lambda: paged_attention_triton(*args, max_seqlen_q=chunk))
    dec = make_paged_batch([1] * (B - 1), [ctx] * (B - 1), H_Q, H_KV, D, BLOCK_SIZE, DTYPE, device,
                           spare_blocks=0)
    ms_dec = bench(lambda: paged_attention_triton(*dec, max_seqlen_q=1))
    return dict(B=B, ctx=ctx, chunk=chunk, triton_ms=ms, decode_only_ms=ms_dec)


def tune(bench, device):
    """Time candidate kernel configs on the two target shapes (results go to the ledger)."""
    out = []
    cases = {"decode B=64 ctx=4096": ([1] * 64, [4096] * 64, 1),
             "prefill T=4096": ([4096], [4096], 4096)}
    for name, (q_lens, kv_lens, mq) in cases.items():
        args = make_paged_batch(q_lens, kv_lens, H_Q, H_KV, D, BLOCK_SIZE, DTYPE, device, spare_blocks=0)
        # Candidates pre-filtered with ptxas -v (registers, shared memory); (block_q, block_n, warps, stages)
        if mq == 1:
            cands = [KernelConfig(4, bn, w, st) for bn, w, st in
                     ((32, 4, 2), (64, 4, 2), (64, 4, 3), (64, 2, 2), (128, 4, 2), (128, 8, 2))]
        else:
            cands = [KernelConfig(bq, bn, w, st) for bq, bn, w, st in
                     ((32, 64, 8, 3), (32, 128, 8, 2), (32, 128, 8, 3), (32, 128, 8, 4), (64, 32, 8, 3),
                      (64, 64, 8, 2), (64, 64, 8, 3), (16, 64, 4, 2))]
        for cfg in cands:
            ms = try_time(bench, lambda: (lambda: paged_attention_triton(*args, max_seqlen_q=mq, config=cfg)))
            out.append(dict(case=name, config=cfg.__dict__, ms=ms))
            print(f"tune {name:22s} {cfg}: {'fail' if ms is None else f'{ms * 1e3:.1f} us'}")
    return out


def host_us_per_call(device) -> float:
    """Host cost per call: back-to-back launches on a small decode, no synchronisation in between."""
    small = make_paged_batch([1], [512], H_Q, H_KV, D, BLOCK_SIZE, DTYPE, device, spare_blocks=0)
    paged_attention_triton(*small, max_seqlen_q=1)
    n = 200 if device == "cuda" else 3
    t0 = time.perf_counter()
    for _ in range(n):
        paged_attention_triton(*small, max_seqlen_q=1)
    us = (time.perf_counter() - t0) / n * 1e6
    if device == "cuda":
        torch.cuda.synchronize()
    return us


def main(argv=None):
    a = parse(argv)
    device = bench_device(a.quick)
    stem = output_stem("bench_attention", a.out, a.quick, device)
    bench = timer(device)
    if a.quick:
        batches, contexts, lengths, mixed_shape = [1, 2], [32, 64], [64], (4, 64, 16)
    else:
        batches, contexts, lengths, mixed_shape = [1, 8, 32, 64], [512, 1024, 4096], [1024, 4096], (64, 4096, 512)
    flex = make_flex(device, device == "cuda" and not a.no_flex)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'unknown'})"
    meta = dict(device=name, torch=torch.__version__, triton=triton.__version__, dtype=str(DTYPE),
                shape=f"H_q={H_Q} H_kv={H_KV} D={D} bf16 block_size={BLOCK_SIZE}",
                copy_GBps=copy_bandwidth(bench, device, 2 ** 30 if device == "cuda" else 2 ** 24), quick=a.quick)
    print(f"{name}: copy bandwidth {meta['copy_GBps']:.0f} GB/s")
    if device == "cpu":
        print("NOTE: CPU run through the Triton interpreter. These numbers are NOT performance.")

    meta["host_us_per_call"] = host_us_per_call(device)
    results = dict(meta=meta)
    if a.tune and device == "cuda":
        results["tune"] = tune(bench, device)
    results["decode"] = bench_decode(bench, device, batches, contexts, flex, ref_max_batch=64)
    results["prefill"] = bench_prefill(bench, device, lengths, flex)
    results["mixed"] = bench_mixed(bench, device, *mixed_shape)
    md = markdown(meta, results["decode"], results["prefill"], results["mixed"])
    print("\n" + md)
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(md + "\n")
    plot(stem + ".png", meta, results["decode"], results["prefill"])
    print(wrote(stem + ".json", stem + ".md", stem + ".png"))


if __name__ == "__main__":
    run_main(main)
