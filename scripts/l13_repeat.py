"""Thinking Machines' experiment, at this engine's scale: the same prompt many times, each time
inside another batch. How many distinct outputs come back, without and with ``batch_invariant``?

    python scripts/l13_repeat.py                       # CPU: tiny Qwen3, float32, 24 repeats (~4 min)
    python scripts/l13_repeat.py --device cuda         # a GPU: bf16, random Qwen3-0.6B shape, 1,000 repeats

Each wave adds 1-8 copies of the prompt and 0-60 other requests of random lengths (0-6 on a CPU)
at once and runs them to the end; the copies land at other rows of other batch sizes every wave. For every copy the
script keeps its greedy tokens and a hash of every step's logits (the bits). Verdict: with the
option, one distinct logits sequence (exit 1 otherwise); without it, the count is the measurement.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repeats", type=int, default=None, help="copies of the prompt (default 24 on a CPU, 1,000 "
                                                              "on a GPU)")
    ap.add_argument("--new", type=int, default=32, help="greedy tokens per request")
    return ap.parse_args(argv)


def run(make, vocab: int, repeats: int, new: int, max_others: int) -> tuple[set, set, int]:
    """(distinct token sequences, distinct logits hashes, waves) of ``repeats`` copies of one prompt."""
    from l4_sampler.params import SamplingParams
    eng, rng = make().llm_engine, random.Random(0)
    prompt = [random.Random(1).randrange(vocab) for _ in range(60)]
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    tokens, bits, done, waves, n = set(), set(), 0, 0, 0
    while done < repeats:
        copies = min(rng.randint(1, 8), repeats - done)
        batch = [None] * copies + [[rng.randrange(vocab) for _ in range(rng.randint(8, 200))]
                                   for _ in range(rng.randint(0, max_others))]
        rng.shuffle(batch)
        ids = []
        for q in batch:                              # the others stop at random steps: the batch shrinks
            n += 1
            p = params if q is None else SamplingParams(temperature=0, max_tokens=rng.randint(1, new),
                                                        ignore_eos=True)
            ids.append((q is None, eng.add_request({"prompt_token_ids": prompt if q is None else q}, p,
                                                   request_id=f"w{n}")))
        while eng.has_unfinished_requests():
            eng.step()
        for is_copy, rid in ids:
            req = eng.requests[rid]
            eng.release(rid)                         # the engine forgets it (its kept logits too)
            if is_copy:
                if len(req.logits) != new:               # (every empty list would hash alike)
                    raise AssertionError(f"{len(req.logits)} steps' logits kept for {new} tokens")
                tokens.add(tuple(req.output_ids))
                h = hashlib.sha256()
                for t in req.logits:
                    h.update(t.float().cpu().numpy().tobytes())
                bits.add(h.hexdigest())
        done += copies
        waves += 1
    return tokens, bits, waves


def main(argv=None):
    a = parse(argv)
    from l13_batch_invariant import LLM
    from l13_batch_invariant import scenarios as sc
    cpu = a.device == "cpu"
    path, vocab, dtype = sc.model_for(a.device)
    others = 6 if cpu else 60
    sizes = dict(num_gpu_blocks_override=400, max_model_len=512, impl="triton") if cpu else \
        dict(num_gpu_blocks_override=4096, max_model_len=1024, max_num_seqs=128)
    repeats = a.repeats or (24 if cpu else 1000)
    print(f"{path} on {a.device} ({str(dtype)[6:]}): one 60-token prompt {repeats} times, {a.new} greedy tokens, "
          f"in waves of 1-8 copies and 0-{others} other requests", flush=True)
    t0, found = time.perf_counter(), {}
    for invariant in (False, True):
        s = time.perf_counter()
        found[invariant] = run(lambda: LLM(path, device=a.device, dtype=dtype, keep_logits=True,
                                           batch_invariant=invariant, **sizes), vocab, repeats, a.new, others)
        toks, bits, waves = found[invariant]
        print(f"batch_invariant={invariant}: {len(toks)} distinct token sequences, {len(bits)} distinct logits "
              f"(bits) of {repeats} copies in {waves} waves ({time.perf_counter() - s:.0f} s)", flush=True)
    ok = len(found[True][1]) == 1
    print(f"verdict: {'PASS' if ok else 'FAIL'} (with the option every copy's every step is the same bits: "
          f"{ok}) ({time.perf_counter() - t0:.0f} s)")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    parse(sys.argv[1:])
    from plumbing.cli import run_main
    run_main(main)
