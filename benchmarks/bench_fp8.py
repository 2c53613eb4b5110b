"""The fp8 KV cache on the GPU: decode attention streams half the bytes, and a pool-limited long-context
workload fits twice the requests.

    python -m benchmarks.bench_fp8              # GPU (a few minutes cold)
    python -m benchmarks.bench_fp8 --quick      # CPU: smoke-test the script (small, float16)

1. Decode kernel, Qwen3-8B's attention (H_q 32, H_kv 8, D 128), block 16, shuffled block table,
   bf16 queries, at 64 x 4,096 and 8 x 8,192 (and 1 x 32,768). Peers in the same run: stage 7's
   kernel on the bf16 cache (each cache's split choice as the engine makes it: cache.num_splits) and SDPA on
   dense bf16 K/V. Each fp8 case is first checked against the reference (fp8_attention_ref).
   Timed from a CUDA graph with L2 flushed; scored against a copy measured here (bytes: codes,
   scales, block table). Goal (issue 19): fp8 >= 1.7x faster than bf16 at the first two shapes.
2. End to end, random-weight Qwen3-0.6B: N requests of P-token prompts and O new tokens each
   (greedy, ignore_eos), the pool fixed (``--pool-requests``: as many bf16 blocks as that many
   requests need), so the pool, not the GPU, limits the running batch. ``auto`` (stage 8's
   bf16 cache) against ``fp8`` in the same memory: throughput (prompt + new tokens / s) and the
   most requests running at once. One untimed warm-up request (its own prompt) first.
A GPU run writes benchmarks/results/bench_fp8/<gpu>.{json,md,png}; --quick writes under out/.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("bench_fp8"))
    ap.add_argument("--quick", action="store_true", help="small shapes, no end-to-end part: smoke-test (CPU ok)")
    ap.add_argument("--no-e2e", action="store_true", help="the decode kernel table only")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--new-tokens", type=int, default=1024)
    ap.add_argument("--pool-requests", type=int, default=16)
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch  # noqa: E402

import plumbing.runtime  # noqa: E402,F401  (before triton: picks GPU or interpreter; stage packages import lazily)
from benchmarks.attention_peers import sdpa  # noqa: E402
from benchmarks.bench_common import NOT_JUDGED, bench_device, ceilings, free, timed  # noqa: E402
from benchmarks.outputs import output_stem, scratch_dir  # noqa: E402
from harness.random_checkpoint import build_checkpoint  # noqa: E402
from l3_paged.paged_batch import make_paged_batch  # noqa: E402
from l7_fast.attention_split import _num_sms, paged_attention_split, pick_num_splits  # noqa: E402
from l9_fp8_kv import fp8_attention_ref, paged_attention_fp8_split  # noqa: E402
from l9_fp8_kv.attention import quantize_batch  # noqa: E402
from l9_fp8_kv.attention_split import fp8_num_splits  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import pyplot, wrote  # noqa: E402

H_Q, H_KV, D, BS = 32, 8, 128, 16



def decode_row(device, dtype, B, ctx, bw):
    base = make_paged_batch([1] * B, [ctx] * B, H_Q, H_KV, D, BS, dtype, device, spare_blocks=0)
    sms = _num_sms(torch.device(device))
    ns, ns8 = pick_num_splits(B, H_KV, ctx, sms), fp8_num_splits(B, H_KV, ctx, sms)   # each cache's rule (cache.num_splits)
    row = dict(B=B, ctx=ctx, splits=ns, fp8_splits=ns8)
    row["bf16_ms"] = timed(device, lambda: paged_attention_split(*base, max_seqlen_q=1, max_seqlen_kv=ctx,
                                                                 num_splits=ns))
    qd = base[0].view(B, H_Q, 1, D)
    kd, vd = (torch.randn(B, H_KV, ctx, D, device=device, dtype=dtype) for _ in range(2))
    row["sdpa_ms"] = timed(device, lambda: sdpa(qd, kd, vd, False))     # K and V apart: SDPA reads both
    table_bytes = base[5].numel() * 4
    row["bf16_bytes"] = 2 * B * ctx * H_KV * D * base[1].element_size() + table_bytes
    for name, per_token in (("fp8", False), ("fp8_per_token_head", True)):
        args = quantize_batch(base, per_token)
        fn = lambda: paged_attention_fp8_split(*args, max_seqlen_q=1, num_splits=ns8)  # noqa: E731
        row[f"{name}_err"] = (fn().float() - fp8_attention_ref(*args, window=None).float()).abs().max().item()
        row[f"{name}_ms"] = timed(device, fn)
        row[f"{name}_bytes"] = 2 * B * ctx * H_KV * (D + (4 if per_token else 0)) + table_bytes
        row[f"{name}_speedup"] = row["bf16_ms"] / row[f"{name}_ms"]
    for k in ("bf16", "fp8", "fp8_per_token_head"):
        row[f"{k}_copy_frac"] = row[f"{k}_bytes"] / row[f"{k}_ms"] / 1e6 / bw if bw else None
    print(f"  decode {B}x{ctx} ({ns} / {ns8} splits): bf16 {row['bf16_ms'] * 1e3:.1f} us, fp8 {row['fp8_ms'] * 1e3:.1f} us "
          f"({row['fp8_speedup']:.2f}x), fp8/token-head {row['fp8_per_token_head_ms'] * 1e3:.1f} us "
          f"({row['fp8_per_token_head_speedup']:.2f}x), SDPA {row['sdpa_ms'] * 1e3:.1f} us", flush=True)
    free()
    return row


def e2e_row(path, kv_cache_dtype, args):
    from l9_fp8_kv import LLM, SamplingParams
    import random
    blocks = args.pool_requests * -(-(args.prompt_len + args.new_tokens) // BS)     # bf16 blocks, every layer
    t0 = time.perf_counter()
    llm = LLM(path, kv_cache_dtype=kv_cache_dtype, num_gpu_blocks_override=blocks,
              max_model_len=args.prompt_len + args.new_tokens)
    startup = time.perf_counter() - t0
    rng = random.Random(0)
    V = llm.model.cfg.vocab_size
    prompts = [{"prompt_token_ids": [rng.randrange(V) for _ in range(args.prompt_len)]} for _ in range(args.requests + 1)]
    sp = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    llm.generate(prompts[:1], sp, use_tqdm=False)                      # warm-up: its own prompt
    engine = llm.llm_engine
    engine.stats.clear()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts[1:], sp, use_tqdm=False)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    new = sum(len(o.outputs[0].token_ids) for o in outs)
    row = dict(kv_cache_dtype=kv_cache_dtype, pool_blocks=engine.scheduler.kv.num_blocks, seconds=dt,
               startup_s=startup, tok_s=(args.requests * args.prompt_len + new) / dt, new_tok_s=new / dt,
               max_running=max(s.running for s in engine.stats),
               preemptions=sum(len(s.preempted) for s in engine.stats), kv_bytes=engine.runner.cache.nbytes)
    print(f"  e2e {kv_cache_dtype}: {row['tok_s']:.0f} tok/s ({dt:.1f} s), pool {row['pool_blocks']} blocks, "
          f"at most {row['max_running']} running, {row['preemptions']} preemptions, start-up {startup:.1f} s",
          flush=True)
    del llm, engine
    free()
    return row


def report(rows, e2e, name, dtype, bw, args, seconds) -> list[str]:
    lines = [f"# fp8 KV cache, {name}, queries {dtype}, H_q {H_Q}, H_kv {H_KV}, D {D}, block {BS}", "",
             "| decode B x ctx | splits (bf16 / fp8) | bf16 cache (stage 7) | fp8, per tensor | speed-up | fp8, per token-head | "
             "speed-up | SDPA, dense bf16 | % of copy BW (bf16 / fp8 / token-head) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        fr = "/".join(f"{100 * r[k + '_copy_frac']:.0f}%" if r[k + "_copy_frac"] else "-"
                      for k in ("bf16", "fp8", "fp8_per_token_head"))
        lines.append(f"| {r['B']} x {r['ctx']} | {r['splits']} / {r['fp8_splits']} | {r['bf16_ms'] * 1e3:.1f} us | {r['fp8_ms'] * 1e3:.1f} us "
                     f"| {r['fp8_speedup']:.2f}x | {r['fp8_per_token_head_ms'] * 1e3:.1f} us | "
                     f"{r['fp8_per_token_head_speedup']:.2f}x | {r['sdpa_ms'] * 1e3:.1f} us | {fr} |")
    if e2e:
        lines += ["", f"end to end, random Qwen3-0.6B, {args.requests} requests x {args.prompt_len}-token prompts x "
                      f"{args.new_tokens} new tokens, pool = the bf16 blocks of {args.pool_requests} requests",
                  "", "| kv cache | pool blocks | KV bytes | tok/s (prompt + new) | new tok/s | most running | "
                      "preemptions | seconds | start-up s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in e2e:
            lines.append(f"| {r['kv_cache_dtype']} | {r['pool_blocks']} | {r['kv_bytes'] / 2**30:.2f} GiB | "
                         f"{r['tok_s']:.0f} | {r['new_tok_s']:.0f} | {r['max_running']} | {r['preemptions']} | "
                         f"{r['seconds']:.1f} | {r['startup_s']:.1f} |")
    goal = [r for r in rows if (r["B"], r["ctx"]) in ((64, 4096), (8, 8192))]
    met = goal and all(r["fp8_speedup"] >= 1.7 for r in goal)
    lines += ["", f"copy bandwidth measured here: {bw:.0f} GB/s" if bw else "copy bandwidth: not measured (CPU)",
              NOT_JUDGED if args.quick else "goal: fp8 decode >= 1.7x faster than bf16 at 64x4096 and 8x8192: "
              + ", ".join(f"{r['fp8_speedup']:.2f}x" for r in goal) + (" -> met" if met else " -> NOT met"),
              f"total {seconds:.0f} s"]
    return lines


def main(argv=None):
    args = parse(argv)
    device = bench_device(args.quick)
    stem = output_stem("bench_fp8", args.out, args.quick, device)
    dtype = torch.float16 if args.quick else torch.bfloat16
    t0 = time.perf_counter()
    bw, _ = ceilings(device)
    shapes = [(2, 256), (1, 512)] if args.quick else [(64, 4096), (8, 8192), (1, 32768)]
    rows = [decode_row(device, dtype, B, ctx, bw) for B, ctx in shapes]
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    bad = [r for r in rows for k in ("fp8_err", "fp8_per_token_head_err") if not r[k] <= tol]
    e2e = []
    if not args.quick and not args.no_e2e:
        path = build_checkpoint(os.path.join(scratch_dir("bench_fp8"), "qwen3-0.6b-random"))
        e2e = [e2e_row(path, kv, args) for kv in ("auto", "fp8")]
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter: not performance)"
    lines = report(rows, e2e, name, dtype, bw, args, time.perf_counter() - t0)
    lines.insert(-1, f"checks: {2 * len(rows) - len(bad)} of {2 * len(rows)} fp8 cases equal the reference within {tol}")
    print("\n".join(lines))
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(stem + ".json", "w") as f:
        json.dump(dict(device=name, dtype=str(dtype), copy_gbps=bw, args=vars(args), decode=rows, e2e=e2e), f, indent=1)
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(8, 4))
        xs = range(len(rows))
        for off, key, label in ((-0.27, "bf16_ms", "bf16 cache (stage 7)"), (0, "fp8_ms", "fp8, per tensor"),
                                (0.27, "fp8_per_token_head_ms", "fp8, per token-head")):
            ax.bar([x + off for x in xs], [r[key] * 1e3 for r in rows], 0.27, label=label)
        ax.set_xticks(list(xs), [f"{r['B']}x{r['ctx']}" for r in rows])
        ax.set(ylabel="us per call (CUDA graph)", title=f"decode attention, {name}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=120)
    print(wrote(stem + ".json", stem + ".md", stem + ".png"))
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
