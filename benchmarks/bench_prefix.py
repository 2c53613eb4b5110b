"""Prefix caching, end to end: the same workloads with the cache on and off, in one run.

    python -m benchmarks.bench_prefix            # GPU: ~3-5 minutes
    python -m benchmarks.bench_prefix --quick    # CPU smoke test of the script (tiny model)

Workloads (random token ids, ignore_eos, greedy):
    shared   256 requests = one 1,000-token system prompt + their own 50..200 tokens; 50..200
             new tokens each. The cache should compute the system prompt once.
    nano     nano-vllm's workload (benchmarks/bench_e2e.py): 256 requests, prompt and output lengths
             uniform in [100, 1024], nothing shared. The cache can only cost here (hashing and
             bookkeeping); it must not be slower.
Model: a random-weight checkpoint of Qwen3-0.6B's shape, bf16, built by harness/random_checkpoint.py
(as for bench_e2e.py). Peer ("caching off"): stage 5's engine (stage 2's allocator, no hashing at all; not stage
6's pool with enable_prefix_caching=False), same pool, same budget, measured in the same run.
Each run starts from a fresh engine (an empty cache).

Each (workload, caching) pair runs --repeats times (default 2), interleaved off/on then on/off,
because host-bound step times drift within one run. Reported per run: output tok/s; the median
decode-only step time; time to first token (mean, p50, p90) and the prefill phase (until
the last request has its first token); prompt tokens, and those computed (prefill work); the hit
rate; and the fraction of the roofline of that run's own schedule (bench_e2e's floor: weights +
K/V bytes per step at the copy bandwidth measured here, FLOPs at the measured matmul rate).
A GPU run writes benchmarks/results/bench_prefix/<gpu>.{json,md,png}; --quick writes under out/.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("bench_prefix"))
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--system-len", type=int, default=1000)
    ap.add_argument("--skip-nano", action="store_true", help="only the shared-prefix workload")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs per (workload, caching), interleaved off/on then on/off (default 2): host-bound "
                         "step times drift within a run, so one pair can mislead")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny model, 8 short requests: smoke-test the script (CPU ok)")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        sys.exit(f"--repeats must be >= 1, got {a.repeats}")
    return a


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch

import plumbing.runtime  # noqa: E402,F401  (before triton: picks GPU or interpreter; stage packages import lazily)
from benchmarks.bench_common import bench_device, ceilings, free, sync, workload  # noqa: E402
from benchmarks.bench_e2e_report import roofline  # noqa: E402
from benchmarks.outputs import output_stem, scratch_dir  # noqa: E402
from harness.random_checkpoint import build_checkpoint  # noqa: E402
from l6_prefix_cache import LLM, SamplingParams  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import pyplot, wrote  # noqa: E402
from plumbing.tiny import tiny_checkpoint  # noqa: E402


def shared_workload(n, system_len, own_lo, own_hi, out_lo, out_hi, vocab, seed):
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(system_len)]
    return [(system + [rng.randrange(vocab) for _ in range(rng.randint(own_lo, own_hi))], rng.randint(out_lo, out_hi))
            for _ in range(n)]


def run(llm, work, caching: bool, label: str):
    """A fresh engine (empty cache), every request added at once, stepped to the end. Off: stage 5's
    engine (the docstring's peer)."""
    from l5_scheduler import build_engine as build5
    from l6_prefix_cache import build_engine as build6
    llm.llm_engine = None
    free()
    eng = llm.llm_engine = build6(llm.model, llm.tokenizer, llm.config, seed=0) if caching else \
        build5(llm.model, llm.tokenizer, llm.config, seed=0)
    ids = [eng.add_request({"prompt_token_ids": p}, SamplingParams(temperature=0, ignore_eos=True, max_tokens=m))
           for p, m in work]
    gc_time, gc_start = [0.0, 0], [0.0]

    def on_gc(phase, info):                                # Python's collector, timed: a host-side suspect
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - gc_start[0]
            gc_time[1] += info["generation"] == 2
    gc.callbacks.append(on_gc)
    first, n_out, step_s = {}, 0, []
    sync()
    t0 = time.perf_counter()
    last = 0.0
    while eng.has_unfinished_requests():
        outs = eng.step()                                  # ends in the sampler's .tolist(): a sync
        now = time.perf_counter() - t0
        step_s.append(now - last)
        last = now
        for o in outs:
            first.setdefault(o.request_id, now)
            n_out += len(o.new_token_ids)
    sync()
    dt = time.perf_counter() - t0
    gc.callbacks.remove(on_gc)
    assert n_out == sum(m for _, m in work), "ignore_eos: every request must run to max_tokens"
    ttft = sorted(first[i] for i in ids)
    prompt = sum(len(p) for p, _ in work)
    computed = sum(s.prefill_tokens for s in eng.stats)
    st = eng.scheduler.kv.stats if caching else None
    r = dict(workload=label, caching=caching, seconds=dt, output_tokens=n_out, tok_per_s=n_out / dt,
             steps=len(eng.stats), preemptions=sum(len(s.preempted) for s in eng.stats),
             ttft_mean_s=statistics.fmean(ttft), ttft_p50_s=ttft[len(ttft) // 2], ttft_p90_s=ttft[int(0.9 * (len(ttft) - 1))],
             prefill_phase_s=ttft[-1], prompt_tokens=prompt, prefill_tokens_computed=computed,
             hit_rate=st.hit_rate if st else 0.0, cache_hits=st.hits if st else 0,
             evictions=eng.scheduler.kv.pool.evictions if caching else 0, gc_s=gc_time[0], gc_gen2=gc_time[1],
             decode_step_ms_median=1e3 * statistics.median([t for t, st in zip(step_s, eng.stats) if not st.prefill_tokens]
                                                           or [float("nan")]))
    print(f"{label:<7} caching {'on ' if caching else 'off'}: {dt:6.1f} s, {r['tok_per_s']:8.0f} out tok/s, "
          f"decode step {r['decode_step_ms_median']:.1f} ms, GC {r['gc_s']:.2f} s ({r['gc_gen2']} full), "
          f"TTFT mean {r['ttft_mean_s']:.2f} s, prefill phase {r['prefill_phase_s']:.2f} s, "
          f"computed {computed}/{prompt} prompt tokens, hit rate {100 * r['hit_rate']:.1f}%", flush=True)
    return r, list(eng.stats), ttft


def markdown(meta, rows):
    lines = [f"Device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}; model {meta['model']} "
             f"({meta['dtype']}); engine {meta['engine']}. "
             + (f"Measured here: copy bandwidth {meta['copy_GBps']:.0f} GB/s, bf16 matmul {meta['matmul_TFLOPs']:.0f} TFLOP/s."
                if meta["copy_GBps"] else "CPU: no roofline (interpreter timings are not performance)."), "",
             "| workload | prefix caching | run | seconds | output tok/s | decode step (ms, median) | TTFT mean (s) | "
             "TTFT p90 (s) | prefill phase (s) | prompt tokens | computed | hit rate | steps | % of own roofline |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rf = r.get("roofline")
        pct = f"{100 * rf['floor_memory_compute_s'] / r['seconds']:.0f}%" if rf else "—"
        lines.append(f"| {r['workload']} | {'on' if r['caching'] else 'off'} | {r['run']} | {r['seconds']:.1f} | "
                     f"{r['tok_per_s']:.0f} | {r['decode_step_ms_median']:.1f} | "
                     f"{r['ttft_mean_s']:.2f} | {r['ttft_p90_s']:.2f} | {r['prefill_phase_s']:.2f} | {r['prompt_tokens']} | "
                     f"{r['prefill_tokens_computed']} | {100 * r['hit_rate']:.1f}% | {r['steps']} | {pct} |")
    lines.append("")
    for w in dict.fromkeys(r["workload"] for r in rows):
        med = {c: {k: statistics.median(r[k] for r in rows if r["workload"] == w and r["caching"] == c)
                   for k in ("tok_per_s", "prefill_phase_s", "prefill_tokens_computed")}
               for c in (True, False) if any(r["workload"] == w and r["caching"] == c for r in rows)}
        if len(med) == 2:
            on, off = med[True], med[False]
            n = sum(r["workload"] == w for r in rows) // 2
            lines.append(f"- {w} (median of {n} run(s) each): caching on/off throughput {on['tok_per_s'] / off['tok_per_s']:.2f}x, "
                         f"prefill phase {off['prefill_phase_s'] / on['prefill_phase_s']:.2f}x shorter, "
                         f"prompt tokens computed {on['prefill_tokens_computed']:.0f} vs {off['prefill_tokens_computed']:.0f}.")
    return "\n".join(lines)


def plot(path, meta, rows, ttfts):
    plt = pyplot()
    if plt is None:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (w, caching), t in ttfts.items():
        a.plot(t, [i / len(t) for i in range(1, len(t) + 1)], label=f"{w}, caching {'on' if caching else 'off'}",
               ls="-" if caching else "--", color="C0" if w == "shared" else "C1")
    a.set_xlabel("time to first token (s)")
    a.set_ylabel("fraction of requests")
    a.set_title("time to first token (all requests arrive at 0)")
    a.legend(fontsize=8)
    labels = [f"{r['workload']}\n{'on' if r['caching'] else 'off'}" for r in rows]
    b.bar(range(len(rows)), [r["tok_per_s"] for r in rows], color=["C0" if r["caching"] else "C7" for r in rows])
    b.set_xticks(range(len(rows)), labels, fontsize=8)
    b.set_ylabel("output tokens / s")
    b.set_title("throughput, prefix caching on vs off")
    fig.suptitle(f"{meta['model']}, {meta['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def setup(a, device):
    """The LLM (warmed up), the workloads, and their description."""
    if a.quick:
        path, model_name = str(tiny_checkpoint("qwen3")), "tiny-qwen3"
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        n, sys_len, own, outl, nano = 8, 40, (4, 12), (4, 8), (4, 24)
        extra = dict(block_size=8, max_num_batched_tokens=64)
    else:
        path, model_name, dtype = build_checkpoint(os.path.join(scratch_dir("bench_prefix"), "qwen3-0.6b-random")), \
            "Qwen3-0.6B shape, random weights", torch.bfloat16
        n, sys_len, own, outl, nano = a.num_requests, a.system_len, (50, 200), (50, 200), (100, 1024)
        extra = {}
    llm = LLM(path, device=device, dtype=dtype, seed=a.seed, **extra)
    llm.config = ec = llm.llm_engine.config
    vocab = llm.model.cfg.vocab_size
    works = {"shared": shared_workload(n, sys_len, *own, *outl, vocab, a.seed)}
    if not a.skip_nano:
        works["nano"] = workload(n, *nano, vocab, a.seed)
    print(f"engine: {ec.num_blocks} blocks x {ec.block_size}, budget {ec.max_num_batched_tokens}, "
          f"max_num_seqs {ec.max_num_seqs}; workloads: {', '.join(f'{k} ({len(v)} requests)' for k, v in works.items())}")
    t = time.perf_counter()                   # warm-up: compile every kernel shape both engines will use
    warm = [r for w in works.values() for r in w[:16]] + ([([1] * 2100, 2)] if not a.quick else [])
    run(llm, warm, True, "warm-up")           # (a nano-only kernel shape once stalled a timed run for ~1 s)
    print(f"warm-up: {time.perf_counter() - t:.1f} s")
    described = {"shared": f"{n} requests: one {sys_len}-token system prompt + own {own[0]}..{own[1]} tokens, "
                           f"{outl[0]}..{outl[1]} new tokens",
                 "nano": f"{n} requests, prompt and output lengths uniform in [{nano[0]}, {nano[1]}]"}
    return llm, works, model_name, dtype, described


def main(argv=None):
    a = parse(argv)
    t_start = time.perf_counter()
    device = bench_device(a.quick)
    stem = output_stem("bench_prefix", a.out, a.quick, device)
    llm, works, model_name, dtype, described = setup(a, device)
    ec = llm.config
    bw, tf = ceilings(device)
    import triton
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'unknown'})"
    meta = dict(device=name, torch=torch.__version__, triton=triton.__version__, model=model_name,
                dtype=str(dtype).replace("torch.", ""), copy_GBps=bw, matmul_TFLOPs=tf,
                engine=f"{ec.num_blocks} blocks x {ec.block_size} tokens, budget {ec.max_num_batched_tokens}, "
                       f"max_num_seqs {ec.max_num_seqs}", workloads=described)
    rows, ttfts = [], {}
    for label, work in works.items():
        for rep in range(a.repeats):
            for caching in ((False, True) if rep % 2 == 0 else (True, False)):
                r, stats, ttft = run(llm, work, caching, label)
                r["run"] = rep + 1
                r["roofline"] = roofline(stats, llm.model.cfg, bw, tf) if device == "cuda" else None
                rows.append(r)
                ttfts.setdefault((label, caching), ttft)
    md = markdown(meta, rows)
    print("\n" + md)
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows, ttft={f"{k[0]}|{k[1]}": v for k, v in ttfts.items()}), f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(md + "\n")
    plot(stem + ".png", meta, rows, ttfts)
    print(wrote(stem + ".json", stem + ".md", stem + ".png") + f"; total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    run_main(main)
