"""Stage 11's greedy identity table: speculation never changes a greedy token.

    python scripts/l11_identity.py                    # torch reference path, float32 (CPU: ~10 s)
    python scripts/l11_identity.py --impl triton      # the Triton kernels (CPU: the interpreter, minutes)

For each tiny checkpoint, k = 1..5, and two workloads (one request alone; six requests with shared
prefixes under a 32-token budget and a 12-block pool, so prompts are chunked, requests preempted
and prefixes hit), the tokens with speculation must equal stage 9's without it (stage 9 = HF:
``check_chain.py``). The guesses come from a replay drafter that is right 60% of the time, so every
run keeps and refuses guesses; a run that verified no guess, or kept none, or refused none, fails.
Prints one row per (checkpoint, workload) and a verdict; exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import sys
import time

from plumbing.cli import run_main

FAMILIES = ("qwen3", "llama", "qwen2")
P = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]
WORKLOADS = {"alone": [P * 2],
             "mixed": [P * 2, P * 2 + [7, 8], P[:9], P[3:] + P[3:12], [5, 6, 7, 8] * 9, P[:20] + P[:20] + P[:5]]}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=("torch", "triton"), default="torch", help="attention and ops path (default torch)")
    ap.add_argument("--families", default=",".join(FAMILIES), help=f"tiny checkpoints (default {','.join(FAMILIES)})")
    ap.add_argument("--max-k", type=int, default=5, help="k = 1..max-k guesses per step (default 5)")
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens per request (default 16)")
    args = ap.parse_args(argv)
    bad = [f for f in args.families.split(",") if f not in FAMILIES]
    if bad or not 1 <= args.max_k <= 16:
        ap.error(f"--families must be from {','.join(FAMILIES)} (got {','.join(bad)}) and --max-k in 1..16")
    return args


def engine_kw(args):
    kw = dict(dtype="float32", max_num_batched_tokens=32, num_gpu_blocks_override=12)
    return kw | (dict(impl="torch", fused_ops=False) if args.impl == "torch" else {})


def generate(llm, prompts, n):
    from l11_spec_decode import SamplingParams
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def row(args, family, name, prompts) -> tuple[str, bool]:
    from l9_fp8_kv import LLM as Stage9
    from l11_spec_decode import LLM
    ref = generate(Stage9(f"tiny-{family}", **engine_kw(args)), prompts, args.new_tokens)
    cells, ok = [], True
    for k in range(1, args.max_k + 1):
        cfg = dict(method="replay", num_speculative_tokens=k, acceptance_rate=0.6,
                   reference={tuple(p): r for p, r in zip(prompts, ref)})
        llm = LLM(f"tiny-{family}", **engine_kw(args), speculative_config=cfg)
        same = generate(llm, prompts, args.new_tokens) == ref
        s = llm.llm_engine.step_order.speculator
        tested = 0 < s.accepted < s.drafted
        cells.append(("same" if same else "DIFF") + ("" if tested else " (untested)")
                     + f" {s.accepted}/{s.drafted}")
        ok &= same and tested
    return f"| tiny-{family} | {name} ({len(prompts)} req) | " + " | ".join(cells) + " |", ok


def main(argv=None) -> int:
    args = parse(argv)
    t0 = time.perf_counter()
    print(f"greedy tokens with speculation vs stage 9 without ({args.impl} path, float32); cells: same/DIFF, "
          "guesses kept/verified")
    print("| checkpoint | workload | " + " | ".join(f"k={k}" for k in range(1, args.max_k + 1)) + " |")
    print("|---|---|" + "---|" * args.max_k)
    rows = [row(args, f, name, prompts) for f in args.families.split(",") for name, prompts in WORKLOADS.items()]
    for line, _ in rows:
        print(line)
    bad = sum(not ok for _, ok in rows)
    n = len(rows) * args.max_k
    print(f"time: {time.perf_counter() - t0:.1f} s")
    if bad:
        print(f"identity: FAIL, {bad} of {len(rows)} rows differ from stage 9 or tested nothing")
        return 1
    print(f"identity: OK, {n} runs (k 1-{args.max_k} x {len(WORKLOADS)} workloads x {len(rows) // len(WORKLOADS)} "
          "checkpoints) emit stage 9's tokens exactly")
    return 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main(sys.argv[1:])))
