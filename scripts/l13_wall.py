"""Lesson 13's wall, measured: does a request's every-step logits depend on what else the engine did?

    python scripts/l13_wall.py                       # CPU: tiny Qwen3, float32, the interpreter (~2 min)
    python scripts/l13_wall.py --device cuda         # a GPU: bf16, a random Qwen3-0.6B-shaped checkpoint

Runs l13_batch_invariant/scenarios.py's pairs (one request undisturbed, and batched, chunked,
preempted and recomputed, a prefix-cache hit, verified by n-gram speculation) twice: with stage 12's
parts and with ``batch_invariant=True``. Prints, per pair, whether every step's logits are the same
bits and whether the greedy tokens are the same, then one verdict line: the option's pairs must all
be equal (exit 1 otherwise).
"""
from __future__ import annotations

import argparse
import gc
import sys
import time


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default: 2,4 on a CPU, 2,16,128 "
                                                    "on a GPU)")
    return ap.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    import torch

    from l13_batch_invariant import LLM
    from l13_batch_invariant import scenarios as sc
    cpu = a.device == "cpu"
    path, vocab, dtype = sc.model_for(a.device)
    if cpu:
        sizes, extra = dict(num_gpu_blocks_override=200, max_model_len=512, impl="triton"), dict(ks=(2,))
    else:
        sizes, extra = dict(num_gpu_blocks_override=1024, max_model_len=1024, max_num_seqs=128), dict(draft=path)
    batches = tuple(int(b) for b in a.batches.split(",")) if a.batches else ((2, 4) if cpu else (2, 16, 128))
    results, t0 = {}, time.perf_counter()
    for invariant in (False, True):
        print(f"l13_wall: batch_invariant={invariant} ...", file=sys.stderr, flush=True)
        r = sc.Runner(lambda **o: LLM(path, device=a.device, dtype=dtype, keep_logits=True,
                                      batch_invariant=invariant, **dict(sizes, **o)))
        results[invariant] = sc.scenarios(r, vocab, batches=batches, **extra)
        del r                                  # its ten-odd engines (each a pool) before the next mode's
        gc.collect()
        if not cpu:
            torch.cuda.empty_cache()
    print(f"\n{path} on {a.device} ({str(dtype)[6:]}): request undisturbed against disturbed, every step's logits\n")
    print("| pair | stage 12's parts: logits | tokens | batch_invariant: logits | tokens |")
    print("|---|---|---|---|---|")
    yes = lambda ok: "same" if ok else "DIFFER"                               # noqa: E731
    for name in results[True]:
        row = [name]
        for invariant in (False, True):
            u, d = results[invariant][name]
            row += [yes(sc.same(u, d)), yes(u[0] == d[0])]
        print("| " + " | ".join(row) + " |")
    off, on = sc.differing(results[False]), sc.differing(results[True])
    n = len(results[True])
    print(f"\nwithout the option {len(off)} of {n} pairs differ; with it {len(on)} of {n}")
    print(f"verdict: {'PASS' if not on else 'FAIL'} ({time.perf_counter() - t0:.0f} s)")
    if on:
        sys.exit(1)


if __name__ == "__main__":
    parse(sys.argv[1:])
    from plumbing.cli import run_main
    run_main(main)
