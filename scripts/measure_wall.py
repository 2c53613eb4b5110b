"""Measure the number each lesson's "why the previous stage hits a wall" section rests on.

    python scripts/measure_wall.py --lesson 2    # dense reservation vs the block allocator, chat mix, 60 GB
    python scripts/measure_wall.py --lesson 3    # lesson 2's gather: bytes copied and time per decode step
    python scripts/measure_wall.py --lesson 4    # the reference sampler's cost per step, V = 151,936
    python scripts/measure_wall.py --lesson 6    # stage 5 on requests sharing a system prompt: work and KV repeated
    python scripts/measure_wall.py --lesson 7    # host time of a decode step at 256 running requests, model stubbed

Shapes are Qwen3-8B's (36 layers, H_q 32, H_kv 8, D 128, bfloat16): no weights are needed, only
the stage's own code (the allocator, the pool's gather, the sampler) on tensors of that shape.
Lesson 7 runs the engines on the built-in tiny Qwen3 with its forward stubbed out.
Times are wall-clock on the machine that runs it (CPU by default): quote them as approximate.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from types import SimpleNamespace

import _path  # noqa: F401
import torch

from l1_dense.cli import run_main
from l1_dense.errors import UserError

QWEN3_8B = SimpleNamespace(num_layers=36, num_q_heads=32, num_kv_heads=8, head_dim=128, vocab=151_936)
MIX = [(0.3, 200), (0.4, 800), (0.2, 2000), (0.1, 6000)]       # share of requests, prompt + output tokens
GB = 10**9


def kv_bytes_per_token(cfg, elem=2) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem     # K and V, all layers


def lesson2(budget_gb: float, block_size: int) -> None:
    """Dense: whole reservations per sequence. Paged: the real BlockAllocator, filled with the mix
    (10 requests per round: 3 x 200, 4 x 800, 2 x 2000, 1 x 6000) until a reservation fails."""
    from l2_gather.allocator import BlockAllocator, OutOfBlocks, Request
    per_tok = kv_bytes_per_token(QWEN3_8B)
    budget = budget_gb * GB
    mean = sum(share * n for share, n in MIX)
    print(f"Qwen3-8B: {per_tok / 1024:.0f} KiB of KV per token; budget {budget_gb:g} GB = {budget / 2**30:.1f} GiB; "
          f"mix mean {mean:g} tokens")
    print("| policy | reserved per sequence | sequences that fit | memory actually used |")
    print("|---|---|---|---|")
    for max_len in (40960, 8192):
        per_seq = max_len * per_tok
        print(f"| dense, max_seq_len {max_len} | {per_seq / 2**30:.3f} GiB | {int(budget // per_seq)} | "
              f"{100 * mean / max_len:.1f}% |")
    alloc = BlockAllocator(int(budget // (block_size * per_tok)), block_size)
    round_ = [n for share, n in MIX for _ in range(round(share * 10))]
    held, tokens = 0, 0
    try:
        while True:
            n = round_[held % len(round_)]
            alloc.reserve(Request(f"r{held}"), n)
            held, tokens = held + 1, tokens + n
    except OutOfBlocks:
        pass
    used_blocks = alloc.num_blocks - alloc.num_free
    slots = used_blocks * block_size
    print(f"| paged, block_size {block_size} | {slots * per_tok / held / 2**20:.0f} MiB on average | {held} | "
          f"{100 * tokens / slots:.2f}% |")
    print(f"internal fragmentation: {slots - tokens} slots over {held} sequences = {100 * (slots - tokens) / slots:.2f}% "
          f"(the mix's lengths; lengths spread evenly would waste (block_size - 1) / 2 = {(block_size - 1) / 2:g} "
          f"slots each, {100 * (block_size - 1) / 2 / mean:.2f}% at this mean)")


def _ms(fn, reps: int) -> float:
    fn()                                                   # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def lesson3(context: int, reps: int) -> None:
    """One decode step of lesson 2's pool at `context` tokens, all 36 layers: the bytes its gather
    copies (summed over the tensors it returns), the time of the gather and of attention alone."""
    from l1_dense.dense_kv import attend_contiguous
    from l2_gather.pool import GatherMeta, KVPool
    cfg, dt, bs = QWEN3_8B, torch.bfloat16, 16
    nb = -(-context // bs)
    pool = KVPool(cfg, nb, bs, "cpu", dt)
    perm = torch.randperm(nb * bs)[:context]             # scattered slots, as after many requests
    meta = GatherMeta(positions=torch.tensor([context - 1]), slot_mapping=perm[-1:], kv_indices=perm,
                      logits_indices=torch.tensor([0]))
    q = torch.randn(1, cfg.num_q_heads, cfg.head_dim, dtype=dt)
    k = torch.randn(1, cfg.num_kv_heads, cfg.head_dim, dtype=dt)

    def gather():
        return [(pool.K[i][perm], pool.V[i][perm]) for i in range(cfg.num_layers)]
    copied = sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in gather())
    k_full, v_full = gather()[0]
    t_gather = _ms(gather, reps)
    t_attn = _ms(lambda: [attend_contiguous(q, k_full, v_full) for _ in range(cfg.num_layers)], reps)
    pool.attend(0, q, k, k, meta)                        # the real call runs on these shapes
    print(f"Qwen3-8B, one sequence, {context} tokens of context, one decode step, bfloat16, {cfg.num_layers} layers:")
    print(f"gather copies {copied / 2**20:.0f} MiB per step per sequence: read from the pool, written, read again "
          f"by attention = {3 * copied / 2**20:.0f} MiB moved where attention needs {copied / 2**20:.0f}")
    print(f"x 64 sequences: {64 * 3 * copied / 2**30:.0f} GiB moved per decode step, "
          f"{64 * 2 * copied / 2**30:.0f} GiB of it overhead")
    print(f"on this machine: gather {t_gather:.0f} ms, attention on the copies {t_attn:.0f} ms per step "
          f"(median of {reps})")


def lesson4(batches: list[int], reps: int) -> None:
    """The stage 4 reference sampler on random logits [B, V]: top-k 50, top-p 0.9, repetition
    penalty 1.2, 600-token histories, seeded rows (one generator per row, as in the lesson)."""
    from l4_sampler.params import SamplingParams
    from l4_sampler.sampler import RowState, Sampler
    V = QWEN3_8B.vocab
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.2, seed=1)
    sampler = Sampler()
    print(f"stage 4 sampler, V = {V}, bfloat16 logits, top-k 50 + top-p 0.9 + repetition penalty 1.2, "
          "600-token histories:")
    for B in batches:
        logits = torch.randn(B, V).to(torch.bfloat16)
        rows = [RowState(params, torch.randint(V, (500,)).tolist(), torch.randint(V, (100,)).tolist())
                for _ in range(B)]
        print(f"B = {B:>3}: {_ms(lambda: sampler(logits, rows), reps):.1f} ms per step on this machine "
              f"(median of {reps})")


def lesson6(n: int, block_size: int) -> None:
    """Stage 5's scheduler (no cache) and stage 6's, driven on host ints alone (no model: every
    sampled token is 1): n requests sharing a 1,000-token system prompt, each with its own 50..200
    tokens and 50..200 new tokens, all arriving at once; budget 8192, 16-token blocks by default.
    Counts the prompt tokens each computes and, at the step where most blocks are held, how many of
    those blocks hold the same content as another held block (equal hash chains)."""
    import random
    from l4_sampler.params import SamplingParams
    from l5_scheduler.request import Request
    from l5_scheduler.scheduler import Scheduler
    from l6_prefix_cache.hashing import block_hashes
    from l6_prefix_cache.scheduler import PrefixCachingScheduler
    rng = random.Random(0)
    system = [rng.randrange(151_936) for _ in range(1000)]
    work = [(system + [rng.randrange(151_936) for _ in range(rng.randint(50, 200))], rng.randint(50, 200))
            for _ in range(n)]
    num_blocks = sum(-(-(len(p) + m) // block_size) for p, m in work)     # room for all: no preemption
    print(f"{n} requests = one 1,000-token system prompt + their own 50..200 tokens, 50..200 new tokens each; "
          f"{block_size}-token blocks, budget 8192, pool {num_blocks} blocks")
    for name, cls in (("stage 5 (no cache)", Scheduler), ("stage 6 (prefix cache)", PrefixCachingScheduler)):
        sched = cls(num_blocks, block_size, 8192, 256)
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
                    r.output_ids.append(1)
                    if len(r.output_ids) == r.params.max_tokens:
                        sched.finish(r, "length")
        prompt = sum(len(p) for p, _ in work)
        print(f"{name:<23}: {steps} steps; prompt tokens computed {computed:,} of {prompt:,} "
              f"({100 * computed / prompt:.0f}%); peak {peak:,} blocks held, of which {dup:,} copies of another "
              f"held block's content")


def lesson7(n: int, reps: int) -> None:
    """The host's share of a decode step, alone: the engines of stage 6, stage 7 without its host
    fast path, and stage 7, each with n running requests (prompts of 100..115 tokens, greedy,
    ignore_eos), on the tiny Qwen3 whose forward is stubbed to return zeros at once. Everything else
    runs for real: scheduling, building and copying the inputs, sampling (an argmax over the tiny
    vocabulary), the stop checks, the bookkeeping. Blocks of 16 steps alternate between the engines
    (reps rounds), so the machine's drift hits all three alike. Calls per step are exact counts."""
    import cProfile
    import pstats
    import random
    from l1_dense.checkpoint import load_model
    from l1_dense.tiny import tiny_checkpoint
    from l4_sampler.params import SamplingParams
    from l4_sampler.stops import StopChecker
    from l5_scheduler.config import make_config
    from l6_prefix_cache.engine import LLMEngine as Stage6Engine
    from l7_fast.engine import LLMEngine as Stage7Engine
    from l7_fast.step_inputs import StepInputs
    model = load_model(tiny_checkpoint("qwen3"), "cpu", torch.float32)
    V, block = model.cfg.vocab_size, 16
    zeros = torch.zeros(n, V)
    model.forward = lambda ids, kv, meta, ops=None: zeros[:meta.logits_indices.shape[0]]    # the stub
    new = block * (reps + 2) + 16             # decoding through every timed and counted step: no request finishes
    config = make_config(model.cfg, "cpu", torch.float32, num_gpu_blocks_override=n * (-(-(116 + new) // 16) + 1),
                         max_num_seqs=n, max_model_len=116 + new)
    rng = random.Random(0)
    prompts = [[rng.randrange(V) for _ in range(100 + i % 16)] for i in range(n)]
    engines = {"stage 6": Stage6Engine(model, None, config),
               "stage 7, host fast path off": Stage7Engine(model, None, config, host_fast_path=False),
               "stage 7": Stage7Engine(model, None, config)}
    for e in engines.values():
        for p in prompts:
            e.add_request({"prompt_token_ids": p}, SamplingParams(temperature=0, ignore_eos=True, max_tokens=new))
        while not e.stats or e.stats[-1].prefill_tokens:        # until every request is decoding
            e.step()
        for _ in range(4):
            e.step()
    print(f"{n} running requests decoding (tiny Qwen3, vocabulary {V}, forward stubbed), {block}-token blocks, "
          f"{reps} rounds of {block} steps per engine, interleaved; CPU: {platform_name()}")
    ms = {k: [] for k in engines}
    for _ in range(reps):
        for k, e in engines.items():
            t = time.perf_counter()
            for _ in range(block):
                e.step()
            ms[k].append((time.perf_counter() - t) / block * 1e3)
    counts = {}
    for k, e in engines.items():                               # exact counts over one block of steps
        c = {"reserve": 0, "update": 0, "row_of": 0}
        reserve, update, row_of = e.scheduler.alloc.reserve, StopChecker.update, StepInputs.row_of

        def counted(fn, key):
            def f(*a, **kw):
                c[key] += 1
                return fn(*a, **kw)
            return f
        e.scheduler.alloc.reserve = counted(reserve, "reserve")
        StopChecker.update, StepInputs.row_of = counted(update, "update"), counted(row_of, "row_of")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(block):
            e.step()
        prof.disable()
        StopChecker.update, StepInputs.row_of = update, row_of
        del e.scheduler.alloc.reserve
        c["calls"] = pstats.Stats(prof).total_calls
        counts[k] = {key: v / block for key, v in c.items()}
    print("| per decode step | " + " | ".join(engines) + " |")
    print("|---|" + "---:|" * len(engines))
    print("| host ms (median of the rounds) | " + " | ".join(f"{statistics.median(ms[k]):.2f}" for k in engines) + " |")
    print("| host ms (fastest round) | " + " | ".join(f"{min(ms[k]):.2f}" for k in engines) + " |")
    rows = (("allocator reserve() calls", "reserve"), ("StopChecker.update() calls", "update"),
            ("block-table row_of() calls", "row_of"), ("Python function calls (cProfile)", "calls"))
    for label, key in rows:
        print(f"| {label} | " + " | ".join(f"{counts[k][key]:,.1f}" for k in engines) + " |")
    a, b = statistics.median(ms["stage 7, host fast path off"]), statistics.median(ms["stage 7"])
    print(f"host fast path: {a / b:.1f}x less host time per step on this machine ({a:.2f} -> {b:.2f} ms)")


def platform_name() -> str:
    import platform
    return f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="measure_wall", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lesson", type=int, required=True, choices=[2, 3, 4, 6, 7], help="whose wall section to measure")
    p.add_argument("--budget-gb", type=float, default=60.0, help="lesson 2: KV memory in GB (10^9 bytes)")
    p.add_argument("--block-size", type=int, default=16, help="lessons 2 and 6: tokens per block")
    p.add_argument("--requests", type=int, default=64, help="lesson 6: requests sharing the system prompt")
    p.add_argument("--context", type=int, default=1024, help="lesson 3: tokens of context")
    p.add_argument("--batch", default="1,64", help="lesson 4: comma-separated batch sizes")
    p.add_argument("--reps", type=int, default=5, help="lessons 3, 4, 7: timed repetitions (the median is shown)")
    p.add_argument("--running", type=int, default=256, help="lesson 7: running requests")
    args = p.parse_args(argv)
    uses = {"--budget-gb": {2}, "--block-size": {2, 6}, "--requests": {6}, "--context": {3}, "--batch": {4},
            "--reps": {3, 4, 7}, "--running": {7}}
    given = {a.split("=")[0] for a in (sys.argv[1:] if argv is None else argv) if a.startswith("--")}
    for flag in sorted(given & set(uses)):
        if args.lesson not in uses[flag]:
            print(f"note       : {flag} applies to lesson(s) {', '.join(map(str, sorted(uses[flag])))} only: "
                  f"ignored for lesson {args.lesson}", file=sys.stderr)
    for flag, v in (("--budget-gb", args.budget_gb), ("--block-size", args.block_size),
                    ("--context", args.context), ("--reps", args.reps), ("--requests", args.requests),
                    ("--running", args.running)):
        if not v > 0:
            raise UserError(f"{flag} must be positive, got {v}.")
    t0 = time.perf_counter()
    if args.lesson == 2:
        lesson2(args.budget_gb, args.block_size)
    elif args.lesson == 3:
        lesson3(args.context, args.reps)
    elif args.lesson == 6:
        lesson6(args.requests, args.block_size)
    elif args.lesson == 7:
        lesson7(args.running, args.reps)
    else:
        try:
            batches = [int(b) for b in args.batch.split(",") if b.strip()]
        except ValueError:
            raise UserError(f"--batch must be comma-separated integers, got {args.batch!r}.") from None
        if not batches or min(batches) < 1:
            raise UserError(f"--batch must list batch sizes >= 1, got {args.batch!r}.")
        lesson4(batches, args.reps)
    print(f"time       : {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
