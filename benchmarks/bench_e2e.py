"""End-to-end throughput of stage 5 on nano-vllm's published workload, against transformers'
continuous batching measured in the same run, and against the workload's roofline.

    python -m benchmarks.bench_e2e                      # GPU: 256 requests, ~5-10 minutes
    python -m benchmarks.bench_e2e --quick              # CPU smoke test of the script (tiny model)

Workload: 256 requests; prompt and output lengths each uniform in [100, 1024]; random token ids;
ignore_eos (every request runs to its max_tokens); greedy. Model: a random-weight checkpoint of
Qwen3-0.6B's shape that the script builds itself (bf16). Peer: transformers' continuous batching
(the manager behind ``generate_batch``), fed the same requests with the same per-request
max_new_tokens; ``--fixed N`` also runs a fixed-output-length variant of the same prompts on both
(``generate_batch`` itself takes one length only). ``--no-async-scheduling``: stage 7's plain step order.
Roofline, summed over our schedule: each step must read every weight once (the tied lm_head only
when a row samples) and the K/V of every scheduled sequence, and write the new tokens' K/V:
floor = bytes / copy bandwidth measured here. A second floor also counts FLOPs against a bf16
matmul measured here: max(bytes / BW, FLOPs / peak) per step. Fraction = floor / measured time.
A GPU run writes benchmarks/results/bench_e2e/<gpu>.{json,md,png}; --quick writes under out/.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time

from benchmarks.outputs import out_help

ENGINES = ("l5_scheduler", "l6_prefix_cache", "l7_fast")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("bench_e2e"))
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--min-len", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--fixed", type=int, default=None, help="also run every request with this output length, both engines")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-hf", action="store_true", help="our engine only")
    ap.add_argument("--hf-timeout", type=float, default=420, help="stop the HF run after this many seconds")
    ap.add_argument("--hf-config", default="", metavar="K=V,...",
                    help="HF's ContinuousBatchingConfig fields, e.g. use_cuda_graph=True,use_async_batching=True "
                         "(default: transformers' own choices)")
    ap.add_argument("--wall", action="store_true", help="also measure stage 4's one-request loop against stage 5 at batch 64")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only redraw the .md and .png from a saved JSON")
    ap.add_argument("--quick", action="store_true", help="tiny model, 8 short requests: smoke-test the script (CPU ok)")
    ap.add_argument("--engine", choices=ENGINES, default="l5_scheduler", help="whose LLM runs (default l5_scheduler)")
    ap.add_argument("--enforce-eager", action="store_true", help="l7_fast only: no CUDA graphs")
    ap.add_argument("--no-async-scheduling", action="store_true", help="l7_fast only: each step waits for its tokens")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the script's own warm-up: time the first generate after LLM(), as a user's first call")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch

import plumbing.runtime  # noqa: E402,F401  (before triton: picks GPU or interpreter; stage packages import lazily)
from benchmarks.bench_common import bench_device, ceilings, free, sync, workload  # noqa: E402
from benchmarks.bench_e2e_hf import hf_config, run_peer  # noqa: E402
from benchmarks.bench_e2e_report import markdown, overlapped, plot, roofline  # noqa: E402
from benchmarks.outputs import output_stem, scratch_dir  # noqa: E402
from harness.random_checkpoint import build_checkpoint  # noqa: E402
from l5_scheduler import LLM, SamplingParams  # noqa: E402
from l7_fast.warmup import cache_entries, triton_cache_dir  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import wrote  # noqa: E402
from plumbing.tiny import tiny_checkpoint  # noqa: E402


def llm_class(engine: str):
    """The stage's ``LLM`` (stage 6 and 7 add prefix caching; stage 7 the fast runner)."""
    return __import__(engine, fromlist=["LLM"]).LLM


def run_ours(llm, work, fixed=None):
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=fixed or m) for _, m in work]
    eng = llm.llm_engine
    eng.stats.clear()
    sync()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in work], params)
    sync()
    dt = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert tokens == sum(p.max_tokens for p in params), "ignore_eos: every request must run to max_tokens"
    return dict(seconds=dt, output_tokens=tokens, tok_per_s=tokens / dt, steps=len(eng.stats),
                preemptions=sum(len(s.preempted) for s in eng.stats)), list(eng.stats)


def wall(llm, device, prompt_len=512, new=64, batch=64):
    """Why stage 4 hits a wall: one request at a time (stage 4's loop) vs `batch` at once (stage 5).
    Stage 4: ms per decoded token = (time for 1 + new tokens - time for 1 token) / new, and the
    share of that time the GPU spends in kernels (torch.profiler, device time / wall time).
    """
    from l3_paged.engine import PagedEngine
    from l4_sampler.generate import sample_generate
    model = llm.model
    rng = random.Random(1)
    prompt = [rng.randrange(model.cfg.vocab_size) for _ in range(prompt_len)]
    nb = -(-(prompt_len + new + 1) // 16)

    def stage4(n):
        e = PagedEngine(model, nb, 16)
        sync()
        t = time.perf_counter()
        sample_generate(e, prompt, SamplingParams(temperature=0, ignore_eos=True, max_tokens=n), (), None)
        sync()
        return time.perf_counter() - t
    run_ours(llm, [(prompt, 4)] * batch)                    # compile this shape's tiles first
    r, _ = run_ours(llm, [(prompt, new)] * batch)
    stage4(4)
    t1, tn = stage4(1), stage4(1 + new)
    ms_tok = (tn - t1) / new * 1e3
    busy = None
    if device == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t = stage4(1 + new)
        dev_us = sum(e.self_device_time_total for e in prof.key_averages())
        busy = dev_us * 1e-6 / t
    return dict(prompt_len=prompt_len, new_tokens=new, stage4_ms_per_token=ms_tok, stage4_tok_per_s=1e3 / ms_tok,
                stage4_gpu_busy=busy, batch=batch, stage5_tok_per_s=r["tok_per_s"], stage5_steps=r["steps"])


def replot(a) -> None:
    from types import SimpleNamespace
    saved = json.load(open(a.replot))
    stem = os.path.splitext(a.replot)[0] if a.out is None else output_stem("bench_e2e", a.out, True, "cpu")
    with open(stem + ".md", "w") as f:
        f.write(markdown(saved["meta"], saved["rows"]) + "\n")
    plot(stem + ".png", saved["meta"], saved["rows"], [SimpleNamespace(**s) for s in saved["schedule"]])
    print(wrote(stem + ".md", stem + ".png"))


def setup(a, device):
    """The checkpoint, our LLM (timed: its start-up) and the workload; then, unless --no-warmup, a
    warm-up on prompts disjoint from the measured ones (another seed: no prefix-cache hits)."""
    if a.quick:
        path, a.num_requests, a.min_len, a.max_len, model_name = str(tiny_checkpoint("qwen3")), 8, 4, 24, "tiny-qwen3"
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
    else:
        path, model_name, dtype = build_checkpoint(os.path.join(scratch_dir("bench_e2e"), "qwen3-0.6b-random")), \
            "Qwen3-0.6B shape, random weights", torch.bfloat16
    kw = dict(enforce_eager=a.enforce_eager, async_scheduling=not a.no_async_scheduling) if a.engine == "l7_fast" else {}
    cache = dict(dir=triton_cache_dir(), entries_before_start=len(cache_entries()))
    sync()
    t = time.perf_counter()
    llm = llm_class(a.engine)(path, device=device, dtype=dtype, seed=a.seed, **kw)
    sync()
    start = dict(seconds=time.perf_counter() - t, triton_cache=cache)
    cache["entries_after_start"] = len(cache_entries())
    report = getattr(llm.llm_engine.runner, "warmup_report", None)
    if report is not None:
        start["warmup"] = dict(shapes=len(report.shapes), seconds=report.seconds, new_cache_entries=report.new_entries)
    print(f"start-up: LLM() took {start['seconds']:.1f} s; Triton cache {cache['dir']}: {cache['entries_before_start']} "
          f"entries before, {cache['entries_after_start']} after")
    work = workload(a.num_requests, a.min_len, a.max_len, llm.model.cfg.vocab_size, a.seed)
    ec = llm.llm_engine.config
    print(f"{len(work)} requests, prompts {a.min_len}..{a.max_len}, outputs {a.min_len}..{a.max_len}; engine: "
          f"{ec.num_blocks} blocks x {ec.block_size}, budget {ec.max_num_batched_tokens}, max_num_seqs {ec.max_num_seqs}")
    if a.no_warmup:
        start["bench_warmup_s"] = None
        print("warm-up: skipped (--no-warmup): the timed run is the first generate after start-up")
    else:                          # stages 5-6 compile on first launch: every tile (decode, mixed, prefill, long)
        warm = workload(16, a.min_len, a.max_len, llm.model.cfg.vocab_size, a.seed + 1) + \
            ([([1] * 2100, 2)] if not a.quick else [])
        t = time.perf_counter()
        run_ours(llm, [(p, 4) for p, _ in warm])
        start["bench_warmup_s"] = time.perf_counter() - t
        print(f"warm-up: {start['bench_warmup_s']:.1f} s (16 prompts of another seed, disjoint from the measured ones)")
    return path, model_name, dtype, llm, work, start


def main(argv=None):
    a = parse(argv)
    for flag, given in (("--enforce-eager", a.enforce_eager), ("--no-async-scheduling", a.no_async_scheduling)):
        if given and a.engine != "l7_fast":
            print(f"note: {flag} is ignored by {a.engine}: it is an option of l7_fast")
    if a.skip_hf and a.hf_config:
        print("note: --hf-config is ignored with --skip-hf (HF does not run)")
    t_start = time.perf_counter()
    if a.replot:
        return replot(a)
    device = bench_device(a.quick)
    stem = output_stem("bench_e2e", a.out, a.quick, device)
    path, model_name, dtype, llm, work, start = setup(a, device)
    cfg, ec = llm.model.cfg, llm.llm_engine.config
    bw, tf = ceilings(device)
    import transformers
    import triton
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'unknown'})"
    meta = dict(device=name, torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__,
                model=model_name, dtype=str(dtype).replace("torch.", ""), copy_GBps=bw, matmul_TFLOPs=tf,
                stage=a.engine + "".join(f" ({o})" for o, on in (("enforce_eager", a.enforce_eager),
                                         ("no async scheduling", a.no_async_scheduling)) if on and a.engine == "l7_fast"),
                workload=f"{len(work)} requests, prompt and output lengths uniform in [{a.min_len}, {a.max_len}], "
                         "random ids, ignore_eos, greedy",
                engine=dict(num_blocks=ec.num_blocks, block_size=ec.block_size,
                            max_num_batched_tokens=ec.max_num_batched_tokens, max_num_seqs=ec.max_num_seqs),
                start=start)
    variants = [("variable", None)] + ([(f"fixed {a.fixed}", a.fixed)] if a.fixed else [])
    rows, schedule = [], None
    for variant, fixed in variants:
        r, stats = run_ours(llm, work, fixed)
        r.update(engine=f"ours ({meta['stage']})", variant=variant, roofline=roofline(stats, cfg, bw, tf, overlapped(llm.llm_engine)) if bw else None)
        schedule = schedule or stats
        r["new_cache_entries"] = len(cache_entries()) - start["triton_cache"]["entries_after_start"]
        rows.append(r)
        print(f"ours  {variant}: {r['output_tokens']} tokens in {r['seconds']:.1f} s = {r['tok_per_s']:.0f} tok/s, {r['steps']} steps, "
              f"{r['new_cache_entries']} Triton cache entries written since start-up")
    if a.wall:                                # last: the profiler slows every later launch
        meta["wall"] = report_wall(wall(llm, device, *((64, 8, 4) if a.quick else ())))
    del llm
    free()
    if not a.skip_hf:
        rows += [run_peer(path, work, device, variant, fixed, a.hf_timeout, hf_config(a.hf_config))
                 for variant, fixed in variants]
    save(stem, meta, rows, schedule)
    print(f"total {time.perf_counter() - t_start:.0f} s")


def report_wall(w: dict) -> dict:
    busy = "n/a" if w["stage4_gpu_busy"] is None else f"{100 * w['stage4_gpu_busy']:.0f}%"
    print(f"wall: stage 4, one request ({w['prompt_len']}-token prompt): {w['stage4_ms_per_token']:.1f} ms/token "
          f"({w['stage4_tok_per_s']:.0f} tok/s), GPU busy {busy}; "
          f"stage 5, {w['batch']} such requests at once: {w['stage5_tok_per_s']:.0f} tok/s")
    return w


def save(stem, meta, rows, schedule) -> None:
    md = markdown(meta, rows)
    print("\n" + md)
    results = dict(meta=meta, rows=rows, schedule=[s.__dict__ for s in schedule])
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(md + "\n")
    plot(stem + ".png", meta, rows, schedule)
    print(wrote(stem + ".json", stem + ".md", stem + ".png"))


if __name__ == "__main__":
    run_main(main)
