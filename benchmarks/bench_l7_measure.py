"""How the stage 7 ledger (benchmarks/bench_l7.py) measures a row: engines built by each stage's
``build_engine``, timed with synchronizes around whole runs, host time from stage 7's Profiler."""
from __future__ import annotations

import statistics
import time

import torch

from benchmarks.bench_common import free, sync
from harness.plain_parts import PlainKVCacheManager, PlainSampler, PlainScheduler, plain_stops
from l4_sampler.params import SamplingParams
from l6_prefix_cache import build_engine as build6
from l7_fast import Profiler, build_engine as build7
from l7_fast.profile import kernel_profile, summarize_timings

PLAIN = "plain"      # a row's parts: stage 7's runner, the plain parts (harness/plain_parts.py)


def make(model, config, fast, profiler=None):
    """fast: None (stage 6), PLAIN, or stage 7's options."""
    wrap = profiler.wrap if profiler is not None else None
    if fast is None:
        return build6(model, None, config, wrap=wrap)
    if fast == PLAIN:            # the plain scheduler and sampler given outright; stage 7's runner; the plain order
        kv = PlainKVCacheManager(config.num_blocks, config.block_size)
        parts = dict(scheduler=PlainScheduler(kv, config.max_num_batched_tokens, config.max_num_seqs),
                     sampler=PlainSampler())
        return build7(model, None, config, parts=parts, wrap=wrap, async_scheduling=False)
    return build7(model, None, config, wrap=wrap, **fast)


def add(engine, prompts, new, plain=False):
    for p in prompts:
        req = engine.make_request({"prompt_token_ids": p}, SamplingParams(temperature=0, ignore_eos=True, max_tokens=new))
        if plain:
            plain_stops(req)
        engine.add(req)


def run(engine, prompts, new) -> float:
    add(engine, prompts, new)
    sync()
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    sync()
    return time.perf_counter() - t


def per_decode_step(model, config, fast, prompts, new, repeats: int = 3) -> tuple[float, list[int]]:
    """ms per decode step: (t(new + 1) - t(1)) / new, each on a fresh engine (no cached prefix); the
    median of ``repeats`` such pairs (one pair alone moved by up to 10% between identical rows)."""
    ms = []
    for _ in range(repeats):
        t1 = run(make(model, config, fast), prompts, 1)
        e = make(model, config, fast)
        tn = run(e, prompts, new + 1)
        ms.append((tn - t1) / new * 1e3)
    return sorted(ms)[len(ms) // 2], [list(r.output_ids) for r in e.requests.values()]


def decoding(model, config, fast, prompts, steps, profiler=None):
    """An engine whose requests are all decoding, with ``steps`` decode steps still to come."""
    e = make(model, config, fast, profiler)
    add(e, prompts, 2 * steps + 8, plain=fast == PLAIN)        # still decoding when the measurement ends
    e.step()
    while e.stats[-1].prefill_tokens:                          # until every request is decoding
        e.step()
    for _ in range(3):
        e.step()
    return e


def steady_time(model, config, fast, prompts, steps=16, host=True) -> dict:
    """ms per step of `steps` steady decode steps, and (stage 7, `host`) the host parts of a step."""
    e = decoding(model, config, fast, prompts, steps)
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        e.step()
    sync()
    out = dict(ms_per_step=(time.perf_counter() - t) / steps * 1e3)
    if host and fast is not None:                              # host parts, on a second engine
        prof = Profiler()
        e2 = decoding(model, config, fast, prompts, steps, prof)
        for _ in range(steps):
            prof.step(e2)
        modes = summarize_timings(prof.timings[-steps:])
        mode = max(modes, key=lambda m: modes[m]["steps"])
        out["host"] = dict(mode=mode, **{k: round(v, 4) for k, v in modes[mode].items()})
        out["graph_bytes"], out["capture_s"] = getattr(e2.runner, "graph_bytes", 0), getattr(e2.runner, "capture_s", 0.0)
    return out


def host_ab(model, config, rows, prompts, rounds=6, block=8) -> dict:
    """Host time per steady decode step of each row's engine, all alive at once, in interleaved
    blocks of `block` steps (`rounds` each), so drift of the machine hits every row alike; the
    median over the steps is robust to a stray slow step. The Profiler's sync after each forward
    separates the host's time from the GPU's."""
    engines = {}
    for label, fast in rows:
        prof = Profiler()
        engines[label] = (decoding(model, config, fast, prompts, rounds * block, prof), prof)
    for _, prof in engines.values():
        prof.timings.clear()
    for _ in range(rounds):
        for e, prof in engines.values():
            for _ in range(block):
                prof.step(e)
    out = {}
    for label, (_, prof) in engines.items():
        t = prof.timings
        keys = [k for k in t[0] if k.endswith("_ms")]
        out[label] = dict(mode=max({x["mode"] for x in t}, key=[x["mode"] for x in t].count), steps=len(t),
                          **{k: round(statistics.median(x[k] for x in t), 4) for k in keys},
                          host_ms_mean=round(statistics.fmean(x["host_ms"] for x in t), 4))
    return out


def steady_kernels(model, config, fast, prompts, steps=16) -> dict:
    """torch.profiler over `steps` steady decode steps. Run after every timing: once the profiler
    has run, every later kernel launch in the process is slower (CUPTI stays attached)."""
    e = decoding(model, config, fast, prompts, steps)
    k = kernel_profile(lambda: [e.step() for _ in range(steps)])
    return dict(kernels=k["kernels"] / steps, launch_calls=k["launch_calls"] / steps,
                gpu_busy_ms=k["gpu_busy_ms"] / steps, top=[[n, c / steps, t / steps] for n, c, t in k["top"]])


def hf_ms_per_token(path, prompt, new, device) -> float:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    ids = torch.tensor([prompt], device=device)

    def gen(n):
        sync()
        t = time.perf_counter()
        m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        sync()
        return time.perf_counter() - t
    gen(2)
    ms = (gen(new + 1) - gen(1)) / new * 1e3
    del m
    free()
    return ms


def floor_ms(cfg, batch, ctx, bw_gbps) -> float:
    """Bytes a decode step must move: every weight once (lm_head included), K/V of `batch` x `ctx`."""
    per_layer = (cfg.hidden_size * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
                 + cfg.num_heads * cfg.head_dim * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size)
    weights = (cfg.num_layers * per_layer + cfg.vocab_size * cfg.hidden_size) * 2
    kv = batch * ctx * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    return (weights + kv) / (bw_gbps * 1e9) * 1e3
