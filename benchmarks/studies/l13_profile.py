"""Where one decode step's time goes with and without ``batch_invariant`` (GPU, bf16, Qwen3-0.6B's
shape, random weights): kernels per step and device µs per step by kernel, torch.profiler.

    python -m benchmarks.studies.l13_profile [--batch 1]     # one GPU, ~1 minute
"""
from __future__ import annotations

import argparse
import os
import random
from collections import defaultdict

import torch


def profile(path: str, invariant: bool, batch: int, steps: int = 32) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from l4_sampler.params import SamplingParams
    from l13_batch_invariant import LLM
    llm = LLM(path, device="cuda", dtype=torch.bfloat16, batch_invariant=invariant,
              num_gpu_blocks_override=batch * 48 + 64)      # 512 + 96 tokens a request: no preemption
    eng, rng = llm.llm_engine, random.Random(0)
    for i in range(batch):
        eng.add_request({"prompt_token_ids": [rng.randrange(1000) for _ in range(512)]},
                        SamplingParams(temperature=0, max_tokens=steps * 3, ignore_eos=True), request_id=f"r{i}")
    for _ in range(steps):                             # prefill and the first decode steps, graphs warm
        eng.step()
    torch.cuda.synchronize()
    preempted = sum(r.num_preemptions for r in eng.requests.values())
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    if sum(r.num_preemptions for r in eng.requests.values()) != preempted or preempted:
        raise AssertionError("a request was preempted: the profile would mix recomputed prefills into decode steps")
    us, n = defaultdict(float), defaultdict(int)
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0:
            us[e.key] += e.self_device_time_total
            n[e.key] += e.count
    total = sum(us.values()) / steps
    print(f"\nbatch_invariant={invariant}, {batch} running: {sum(n.values()) / steps:.0f} kernels, "
          f"{total:.0f} µs of kernels per step")
    for k in sorted(us, key=us.get, reverse=True)[:14]:
        print(f"  {us[k] / steps:8.1f} µs  {n[k] / steps:5.1f}/step  {k[:90]}")
    while eng.has_unfinished_requests():
        eng.step()
    del llm, eng, prof
    import gc
    gc.collect()
    torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="running requests (default 1 64)")
    a = ap.parse_args(argv)
    from benchmarks.outputs import scratch_dir
    from harness.random_checkpoint import build_checkpoint
    path = build_checkpoint(os.path.join(scratch_dir("bench_l13_cost"), "qwen3-0.6b-random"), "Qwen/Qwen3-0.6B")
    for b in a.batch:
        for inv in (False, True):
            profile(path, inv, b)


if __name__ == "__main__":
    main()
