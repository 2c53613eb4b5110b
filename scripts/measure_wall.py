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

from wall_engine import lesson6, lesson7

from plumbing.cli import run_main
from plumbing.errors import UserError

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
    import torch
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
    import torch
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
