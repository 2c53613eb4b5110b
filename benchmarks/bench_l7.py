"""Stage 7's optimisation ledger, measured: each part of the fast runner switched on in turn, in one run.

    python -m benchmarks.bench_l7                  # GPU: Qwen3-0.6B shape, random weights, bf16
    python -m benchmarks.bench_l7 --quick          # CPU smoke test of the script (tiny model)

Rows (cumulative; every row has the engine loop's own cheap branches, lesson 7.5):
    stage 6          the engine before this lesson (stage 3's kernel, torch ops, 7 copies per step)
    + inputs         l7 runner, eager: pinned inputs, one copy, incremental block table, no per-layer checks
    + fused ops      + fused add+RMSNorm, q/k-norm+RoPE+KV-write, SiLU*mul, merged qkv / gate_up matmuls
    + CUDA graphs    + decode steps replay one graph per batch bucket
    + split-KV       + decode attention split over the keys
    + small-M GEMV   + steps of <= 2 tokens: Triton GEMVs instead of cuBLAS, SwiGLU in the epilogue
    + norm in the GEMV  + those steps: each add + RMSNorm in the next GEMV's prologue
    + async scheduling  + the engine's overlapped step order: the host schedules step n+1 and
                     checks step n's tokens while the GPU computes
    + PDL            + Hopper's programmatic dependent launch for the GEMVs, rope write, split-KV
                     and merge: the next kernel starts (and streams its weights) while one drains
                     (the full stage 7; on an older GPU this row equals the one before)
Peer, in the same run: transformers' ``generate`` on the same checkpoint (single stream).

Per row:
    single stream    one request, 512-token prompt, 256 new tokens (greedy, ignore_eos):
                     ms per decoded token = (t(257 new) - t(1 new)) / 256
    batch 64         64 such requests decoding together: ms per step, from the same difference
    steady           16 steady decode steps (one block's worth) at batch 1 and at batch 64: ms per
                     step, and the host parts of a step (schedule, execute, advance, sample;
                     l7_fast.profile); graph memory
    host, 256        at 256 running requests (prompts of 512..527 tokens, so block boundaries are
                     spread over the steps as in real traffic), stage 7 against the same engine
                     with the plain parts (harness/plain_parts.py: no cheap branches) and against
                     itself in the plain step order: ms per step (unprofiled), host ms per step
                     and its parts (median over 48 steps, the engines alive at once and stepped in
                     interleaved blocks of 8; the Profiler's sync after each forward serialises
                     the overlapped order, so its host figure is the work it hides), GPU busy
    profile          torch.profiler over 8 such steps, LAST (once the profiler has run, every later
                     launch in the process is slower; HF is timed before it):
                     GPU kernels per step, host launch calls per step, GPU busy ms per step;
                     busy % = busy ms / unprofiled ms per step
Roofline: a decode step must read every weight once and the K/V in use; floor = bytes / copy
bandwidth measured here; fraction = floor / measured. A GPU run writes benchmarks/results/bench_l7/<gpu>.{json,md,png}; --quick writes under out/.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("bench_l7"))
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new", type=int, default=256, help="decoded tokens, single stream")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-new", type=int, default=64, help="decoded tokens per request at --batch")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--host-batch", type=int, default=256, help="also measure the host at this many running "
                    "requests, with and without the cheap branches (0: skip)")
    ap.add_argument("--rows", default=None, help="comma-separated row indices to run (default all)")
    ap.add_argument("--quick", action="store_true", help="tiny model, short runs: smoke-test the script (CPU ok)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch

import plumbing.runtime  # noqa: E402,F401  (before triton: picks GPU or interpreter; stage packages import lazily)
from benchmarks.bench_common import bench_device, ceilings, free  # noqa: E402
from benchmarks.bench_l7_measure import (PLAIN, floor_ms, hf_ms_per_token, host_ab, make, per_decode_step,  # noqa: E402
                                         run, steady_kernels, steady_time)
from benchmarks.bench_l7_report import host_parts, markdown, plot  # noqa: E402
from benchmarks.outputs import output_stem, save_results, scratch_dir  # noqa: E402
from harness.random_checkpoint import build_checkpoint  # noqa: E402
from l1_dense.checkpoint import load_model  # noqa: E402
from l5_scheduler.config import make_config  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import wrote  # noqa: E402
from plumbing.tiny import tiny_checkpoint  # noqa: E402

ROWS = [("stage 6", None),
        ("+ inputs", dict(enforce_eager=True, fused_ops=False, split_kv=False, pdl=False)),
        ("+ fused ops", dict(enforce_eager=True, fused_ops=True, split_kv=False, pdl=False)),
        ("+ CUDA graphs", dict(enforce_eager=False, fused_ops=True, split_kv=False, pdl=False)),
        ("+ split-KV", dict(enforce_eager=False, fused_ops=True, split_kv=True, gemv=False, pdl=False)),
        ("+ small-M GEMV", dict(enforce_eager=False, fused_ops=True, split_kv=True, gemv=True, norm_prologue=False, pdl=False)),
        ("+ norm in the GEMV", dict(enforce_eager=False, fused_ops=True, split_kv=True, gemv=True, norm_prologue=True,
                                    async_scheduling=False, pdl=False)),
        ("+ async scheduling", dict(enforce_eager=False, fused_ops=True, split_kv=True, gemv=True, norm_prologue=True,
                                    async_scheduling=True, pdl=False)),
        ("+ PDL", dict(enforce_eager=False, fused_ops=True, split_kv=True, gemv=True, norm_prologue=True,
               async_scheduling=True, pdl=True))]
HOST_ROWS = [("plain parts", PLAIN), ("plain order", ROWS[6][1]), ("stage 7", ROWS[-1][1])]   # at 256 running


def measure_row(label, fast, model, config, prompts, a, bw, tokens) -> dict:
    t = time.perf_counter()
    run(make(model, config, fast), prompts[:1], 2)             # compile every shape the timed runs use
    run(make(model, config, fast), prompts, 2)                 # (prefill kernels too), capture; not timed
    free()                                                     # (and their memory back before the timed ones)
    r = dict(row=label, fast=fast)
    r["single_ms"], tok1 = per_decode_step(model, config, fast, prompts[:1], a.new)
    r["batch_ms"], tokb = per_decode_step(model, config, fast, prompts, a.batch_new)
    r["batch_tok_s"] = a.batch / r["batch_ms"] * 1e3
    tokens[label] = (tok1, tokb)
    if bw:
        cfg = model.cfg
        r["profile_1"] = steady_time(model, config, fast, prompts[:1])
        r["profile_b"] = steady_time(model, config, fast, prompts)
        r["single_roofline_pct"] = 100 * floor_ms(cfg, 1, a.prompt_len + a.new // 2, bw) / r["single_ms"]
        r["batch_roofline_pct"] = 100 * floor_ms(cfg, a.batch, a.prompt_len + a.batch_new // 2, bw) / r["batch_ms"]
    r["same_tokens_as_row0"] = tokens[label] == next(iter(tokens.values()))
    p1, pb = r.get("profile_1", {}), r.get("profile_b", {})
    print(f"{label:16s} single {r['single_ms']:7.2f} ms/token  batch {a.batch}: {r['batch_ms']:7.2f} ms/step "
          f"({r['batch_tok_s']:.0f} tok/s)" + (f"  steady ms/step b1 {p1['ms_per_step']:.2f}, b{a.batch} "
                                              f"{pb['ms_per_step']:.2f}" if p1 else "")
          + f"  tokens = first row's: {r['same_tokens_as_row0']}  ({time.perf_counter() - t:.0f} s)", flush=True)
    if pb.get("host"):
        print(f"{'':16s} host ms/step b1 {p1['host']['host_ms']:.3f}, b{a.batch} {pb['host']['host_ms']:.3f} "
              f"({host_parts(pb['host'])}); graphs {pb['graph_bytes'] / 2**20:.0f} MiB, "
              f"captured in {pb['capture_s']:.1f} s")
    free()
    return r


def measure_host256(model, cfg, config256, big) -> dict:
    """Stage 7 with and without the cheap branches at 256 running requests: ms and host ms per step."""
    host256 = {}
    for label, fast in HOST_ROWS:                              # unprofiled ms per step
        run(make(model, config256, fast), big, 2)              # compile and capture, not timed
        free()
        host256[label] = dict(ms_per_step=steady_time(model, config256, fast, big, steps=32, host=False)["ms_per_step"])
        free()
    for label, h in host_ab(model, config256, HOST_ROWS, big).items():   # host time, the rows interleaved
        host256[label]["host"] = h
        print(f"batch {len(big)}, {label}: {host256[label]['ms_per_step']:.2f} ms/step ({h['mode']}), host "
              f"{h['host_ms']:.3f} ms/step median of {h['steps']} interleaved steps (mean {h['host_ms_mean']:.3f}; "
              f"{host_parts(h)})", flush=True)
    free()
    return host256


def kernels_last(rows, host256, model, config, config256, prompts, big, batch) -> None:
    """The profiler, after every timing (see steady_kernels)."""
    for r in rows:
        for key, ps in (("profile_1", prompts[:1]), ("profile_b", prompts)):
            k = steady_kernels(model, config, r["fast"], ps)
            k["busy_pct"] = 100 * k["gpu_busy_ms"] / r[key]["ms_per_step"]
            r[key].update(k)
        p1, pb = r["profile_1"], r["profile_b"]
        print(f"{r['row']:16s} b1: {p1['kernels']:.0f} kernels, {p1['launch_calls']:.0f} launch calls, GPU busy "
              f"{p1['gpu_busy_ms']:.2f} ms = {p1['busy_pct']:.0f}%  | b{batch}: {pb['kernels']:.0f} kernels, "
              f"{pb['launch_calls']:.0f} calls, busy {pb['gpu_busy_ms']:.2f} ms = {pb['busy_pct']:.0f}%", flush=True)
    for label, fast in HOST_ROWS if host256 else ():
        k = steady_kernels(model, config256, fast, big)
        host256[label].update(k, busy_pct=100 * k["gpu_busy_ms"] / host256[label]["ms_per_step"])
        print(f"batch {len(big)}, {label}: GPU busy {host256[label]['busy_pct']:.0f}%", flush=True)


def main(argv=None):
    a = parse(argv)
    t_start = time.perf_counter()
    device = bench_device(a.quick)
    stem = output_stem("bench_l7", a.out, a.quick, device)
    if a.quick:
        path, model_name = str(tiny_checkpoint("qwen3")), "tiny-qwen3"
        a.prompt_len, a.new, a.batch, a.batch_new = 16, 4, 4, 3
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
    else:
        path, model_name, dtype = build_checkpoint(os.path.join(scratch_dir("bench_e2e"), "qwen3-0.6b-random")), \
            "Qwen3-0.6B shape, random weights", torch.bfloat16
    model = load_model(Path(path), device, dtype)
    cfg = model.cfg
    rng = random.Random(0)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(a.prompt_len)] for _ in range(a.batch)]
    ctx = a.prompt_len + max(a.new, a.batch_new) + 2
    config = make_config(cfg, device, dtype, num_gpu_blocks_override=a.batch * (-(-ctx // 16)) + 64,
                         max_num_seqs=max(a.batch, 1), max_model_len=min(cfg.max_position_embeddings, 4096))
    bw, tf = ceilings(device)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'unknown'})"
    print(f"{name}, {model_name}, {str(dtype)[6:]}; single stream: {a.prompt_len}-token prompt, {a.new} new; "
          f"batch {a.batch}: {a.batch_new} new each" + (f"; copy {bw:.0f} GB/s" if bw else ""))
    chosen = range(len(ROWS)) if a.rows is None else [int(i) for i in a.rows.split(",")]
    tokens = {}
    rows = [measure_row(*ROWS[i], model, config, prompts, a, bw, tokens) for i in chosen]
    host256, big, c256 = {}, [], None
    if device == "cuda" and a.host_batch:
        big = [[rng.randrange(cfg.vocab_size) for _ in range(a.prompt_len + i % 16)] for i in range(a.host_batch)]
        c256 = make_config(cfg, device, dtype, num_gpu_blocks_override=a.host_batch * (-(-(ctx + 16) // 16)) + 64,
                           max_num_seqs=a.host_batch, max_model_len=min(cfg.max_position_embeddings, 4096))
        host256 = measure_host256(model, cfg, c256, big)
    hf = None if a.skip_hf else hf_ms_per_token(path, prompts[0], a.new, device)
    if hf is not None:
        print(f"HF generate    single {hf:7.2f} ms/token")
    if device == "cuda":
        kernels_last(rows, host256, model, config, c256, prompts, big, a.batch)
    meta = dict(device=name, torch=torch.__version__, triton=__import__("triton").__version__,
                transformers=__import__("transformers").__version__, model=model_name, dtype=str(dtype)[6:],
                copy_GBps=bw, matmul_TFLOPs=tf, prompt_len=a.prompt_len, new=a.new, batch=a.batch,
                batch_new=a.batch_new, hf_single_ms=hf, host_batch=a.host_batch, host256=host256,
                floor_single_ms=floor_ms(cfg, 1, a.prompt_len + a.new // 2, bw) if bw else None,
                floor_batch_ms=floor_ms(cfg, a.batch, a.prompt_len + a.batch_new // 2, bw) if bw else None)
    save(stem, meta, rows)
    print(f"total {time.perf_counter() - t_start:.0f} s")


def save(stem, meta, rows) -> None:
    for r in rows:
        r["fast"] = str(r["fast"])                             # JSON: the row's options, as text
        for key in ("profile_1", "profile_b"):
            if r.get(key, {}).get("top"):
                print(f"top kernels, {r['row']}, {key}: " + "; ".join(f"{n} x{c:.0f} {t:.3f} ms" for n, c, t in r[key]["top"][:8]))
    md = markdown(meta, rows)
    print("\n" + md)
    print(wrote(*save_results(stem, dict(meta=meta, rows=rows), md, lambda plt, p: plot(plt, p, meta, rows))))


if __name__ == "__main__":
    run_main(main)
