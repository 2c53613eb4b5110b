"""measure_wall.py's engine lessons: 6 (the work a prefix cache saves) and 7 (the host's share of a
decode step at 256 running requests). Both run the engine's own code on host ints; nothing here
needs a GPU. measure_wall.py imports this module; this module imports nothing from it."""
from __future__ import annotations

import statistics
import time


def lesson6(n: int, block_size: int) -> None:
    """Stage 5's scheduler with stage 2's allocator (no cache) and with stage 6's KV manager, driven on
    host ints alone (no model: every sampled token is 1): n requests sharing a 1,000-token system
    prompt, each with its own 50..200 tokens and 50..200 new tokens, all arriving at once; budget
    8192, 16-token blocks by default. Counts the prompt tokens each computes and, at the step where
    most blocks are held, how many of those blocks hold the same content as another held block
    (equal hash chains)."""
    import random
    from l4_sampler.params import SamplingParams
    from l5_scheduler.kv_manager import BlockManager
    from l5_scheduler.request import Request
    from l5_scheduler.scheduler import Scheduler
    from l6_prefix_cache.hashing import block_hashes
    from l6_prefix_cache.kv_manager import KVCacheManager
    rng = random.Random(0)
    system = [rng.randrange(151_936) for _ in range(1000)]
    work = [(system + [rng.randrange(151_936) for _ in range(rng.randint(50, 200))], rng.randint(50, 200))
            for _ in range(n)]
    num_blocks = sum(-(-(len(p) + m) // block_size) for p, m in work)     # room for all: no preemption
    print(f"{n} requests = one 1,000-token system prompt + their own 50..200 tokens, 50..200 new tokens each; "
          f"{block_size}-token blocks, budget 8192, pool {num_blocks} blocks")
    for name, kv_cls in (("stage 5 (no cache)", BlockManager), ("stage 6 (prefix cache)", KVCacheManager)):
        sched = Scheduler(kv_cls(num_blocks, block_size), 8192, 256)
        reqs = [Request(f"r{i}", p, SamplingParams(max_tokens=m), arrival=i) for i, (p, m) in enumerate(work)]
        for r in reqs:
            sched.add(r)
        computed = peak = dup = steps = 0
        while sched.has_unfinished():
            out = sched.schedule()
            sched.advance(out)
            steps += 1
            computed += sum(n for (r, n), pre in zip(out.scheduled, out.prefill) if pre)
            held = {b for r in sched.running for b in r.blocks}
            if len(held) > peak:                  # physical block -> the hash chain of what it holds
                content = {b: h for r in sched.running
                           for b, h in zip(r.blocks, block_hashes(r.tokens(0, r.num_computed_tokens), block_size))}
                peak, dup = len(held), len(content) - len(set(content.values()))
            for (r, n), s in zip(out.scheduled, out.sample):
                if s:
                    r.append_output(1)
                    if len(r.output_ids) == r.params.max_tokens:
                        sched.finish(r, "length")
        prompt = sum(len(p) for p, _ in work)
        print(f"{name:<23}: {steps} steps; prompt tokens computed {computed:,} of {prompt:,} "
              f"({100 * computed / prompt:.0f}%); peak {peak:,} blocks held, of which {dup:,} copies of another "
              f"held block's content")


def _engines(model, config):
    """The three engines of lesson 7's wall, all with the model's forward stubbed."""
    from harness.plain_parts import PlainKVCacheManager, PlainSampler, PlainScheduler
    from l6_prefix_cache import build_engine as build6
    from l7_fast import build_engine as build7
    sched = PlainScheduler(PlainKVCacheManager(config.num_blocks, config.block_size), config.max_num_batched_tokens,
                           config.max_num_seqs)
    plain = build7(model, None, config, parts=dict(scheduler=sched, sampler=PlainSampler()),   # stage 7's runner,
                   fused_ops=False, async_scheduling=False)                     # the skeleton's torch ops, plain order
    return {"plain parts, stage 7's runner": plain, "stage 6": build6(model, None, config),
            "stage 7": build7(model, None, config, async_scheduling=False)}   # (7.11 hides host work, 7.6 counts it)


def _decoding_engines(n: int, new: int):
    """The three engines, each with n requests decoding (no request finishes within ``new`` tokens)."""
    import random

    import torch

    from harness.plain_parts import plain_stops
    from l1_dense.checkpoint import load_model
    from l4_sampler.params import SamplingParams
    from l5_scheduler.config import make_config
    from plumbing.tiny import tiny_checkpoint
    model = load_model(tiny_checkpoint("qwen3"), "cpu", torch.float32)
    V = model.cfg.vocab_size
    zeros = torch.zeros(n, V)
    model.forward = lambda ids, kv, meta, ops=None: zeros[:meta.logits_indices.shape[0]]    # the stub
    config = make_config(model.cfg, "cpu", torch.float32, num_gpu_blocks_override=n * (-(-(116 + new) // 16) + 1),
                         max_num_seqs=n, max_model_len=116 + new)
    rng = random.Random(0)
    prompts = [[rng.randrange(V) for _ in range(100 + i % 16)] for i in range(n)]
    engines = _engines(model, config)
    for k, e in engines.items():
        for p in prompts:
            req = e.make_request({"prompt_token_ids": p}, SamplingParams(temperature=0, ignore_eos=True, max_tokens=new))
            if k.startswith("plain"):
                plain_stops(req)
            e.add(req)
        while not e.stats or e.stats[-1].prefill_tokens:        # until every request is decoding
            e.step()
        for _ in range(4):
            e.step()
    return engines, V


def lesson7(n: int, reps: int) -> None:
    """The host's share of a decode step, alone: n running requests (prompts of 100..115 tokens,
    greedy, ignore_eos) on the tiny Qwen3 whose forward is stubbed to return zeros at once.
    Everything else runs for real: scheduling, building and copying the inputs, sampling (an argmax
    over the tiny vocabulary), the stop checks, the bookkeeping. Three engines:

        plain parts    the engine's parts without their cheap branches (harness/plain_parts.py:
                       every decision asked in full for every request), with stage 7's runner
        stage 6        the real parts, stage 5's runner (build_meta, 7 copies, the whole table)
        stage 7        the real parts, stage 7's runner (one pinned copy, block-table diffs)

    Blocks of 16 steps alternate between the engines (reps rounds), so the machine's drift hits all
    three alike. Calls per step are exact counts."""
    import cProfile
    import pstats

    from l4_sampler.stops import StopChecker
    from l7_fast.step_inputs import StepInputs
    block = 16
    engines, V = _decoding_engines(n, block * (reps + 2) + 16)   # decoding through every timed and counted step
    print(f"{n} running requests decoding (tiny Qwen3, vocabulary {V}, forward stubbed), {block}-token blocks, "
          f"{reps} rounds of {block} steps per engine, interleaved; CPU: {platform_name()}")
    ms = {k: [] for k in engines}
    for _ in range(reps):
        for k, e in engines.items():
            t = time.perf_counter()
            for _ in range(block):
                e.step()
            ms[k].append((time.perf_counter() - t) / block * 1e3)
    counts = {k: _count(e, block, StopChecker, StepInputs, cProfile, pstats) for k, e in engines.items()}
    print("| per decode step | " + " | ".join(engines) + " |")
    print("|---|" + "---:|" * len(engines))
    print("| host ms (median of the rounds) | " + " | ".join(f"{statistics.median(ms[k]):.2f}" for k in engines) + " |")
    print("| host ms (fastest round) | " + " | ".join(f"{min(ms[k]):.2f}" for k in engines) + " |")
    rows = (("KV manager reserve() calls", "reserve"), ("StopChecker.update() calls", "update"),
            ("block-table row_of() calls", "row_of"), ("Python function calls (cProfile)", "calls"))
    for label, key in rows:
        print(f"| {label} | " + " | ".join(f"{counts[k][key]:,.1f}" for k in engines) + " |")
    a, b = statistics.median(ms["plain parts, stage 7's runner"]), statistics.median(ms["stage 7"])
    print(f"cheap branches: {a / b:.1f}x less host time per step on this machine ({a:.2f} -> {b:.2f} ms)")


def platform_name() -> str:
    import platform
    return f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"


def _count(e, block: int, StopChecker, StepInputs, cProfile, pstats) -> dict:
    """Exact counts over one block of steps of engine ``e``, per step."""
    c = {"reserve": 0, "update": 0, "row_of": 0}
    kv = e.scheduler.kv
    reserve, update, row_of = kv.reserve, StopChecker.update, StepInputs.row_of

    def counted(fn, key):
        def f(*a, **kw):
            c[key] += 1
            return fn(*a, **kw)
        return f
    kv.reserve = counted(reserve, "reserve")
    StopChecker.update, StepInputs.row_of = counted(update, "update"), counted(row_of, "row_of")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(block):
        e.step()
    prof.disable()
    StopChecker.update, StepInputs.row_of = update, row_of
    del kv.reserve
    c["calls"] = pstats.Stats(prof).total_calls
    return {key: v / block for key, v in c.items()}
