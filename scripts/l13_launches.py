"""How many kernels one decode step launches with batch_invariant, counted on any machine (no GPU).

    python scripts/l13_launches.py                  # Qwen3-0.6B's shape, one request, an H100's choices
    python scripts/l13_launches.py --batch 64

One decode step of a single request is launch-bound on a GPU (lesson 13.4): its time follows the
number of kernels. This script counts them without a GPU: it builds a random Qwen3-0.6B-shaped
checkpoint cut to one layer and to two (every layer launches the same kernels), runs a prefill
and one decode step of ``--batch`` requests through stage 13's engine with every Triton launch compiled
for sm_90 instead of run (harness/gpu_compile.py: no kernel runs, the tokens mean nothing), and
counts the decode step's launches per kernel. The matmul's tile and split and the attention's
split count are the host's choices for ``--sms`` SMs (the SM count is read off the GPU on one;
here it is given). A layer's launches = two layers' - one layer's; the rest (the final norm, the
lm_head) = one layer's - a layer's; a step of the real model = the rest + 28 x a layer's. With batch_invariant every matmul is Triton's, so this is nearly every kernel of the
step: torch's own (the embedding, the sampler, copies) are not counted.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = 28                                     # Qwen3-0.6B


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1, help="requests in the decode step")
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SM count the host's choices assume (H100: 132)")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.sms < 1:
        ap.error("--batch and --sms must be at least 1")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    from harness.gpu_compile import compile_launches, compile_only_process
    compile_only_process("scripts/l13_launches.py")
    import l7_fast.runner
    import l13_batch_invariant.matmul
    from harness.random_checkpoint import build_checkpoint
    for module in (l13_batch_invariant.matmul, sys.modules.get("l13_batch_invariant.tiles"), l7_fast.runner):
        for name in ("num_sms", "_num_sms"):           # the host's SM count (the matmul's, the attention's): --sms
            if module is not None and hasattr(module, name):
                setattr(module, name, lambda device: a.sms)
    t0 = time.perf_counter()
    one, two = (count(a, compile_launches, build_checkpoint(
        os.path.join(ROOT, "out", "gpu_compile", f"qwen3-0.6b-{n}-layers"), num_layers=n)) for n in (1, 2))
    print(f"stage 13, batch_invariant: one decode step of {a.batch} request(s), Qwen3-0.6B's shape, the host's "
          f"choices for {a.sms} SMs (Triton launches; torch's own kernels not counted)\n")
    print(f"{'kernel':30s} {'a layer':>8s} {'the rest':>9s} {f'{LAYERS} layers':>10s}")
    for name in sorted(set(one) | set(two)):
        per, rest = two[name] - one[name], 2 * one[name] - two[name]
        print(f"{name:30s} {per:8d} {rest:9d} {rest + LAYERS * per:10d}")
    per, rest = sum(two.values()) - sum(one.values()), 2 * sum(one.values()) - sum(two.values())
    print(f"{'all':30s} {per:8d} {rest:9d} {rest + LAYERS * per:10d}")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


def count(a, compile_launches, path) -> collections.Counter:
    """The decode step's launches by kernel, in an engine of ``path``'s layers: the engine built and
    the prompts prefilled under one compile_launches, the decode step alone under a second."""
    import torch

    from l4_sampler.params import SamplingParams
    from l13_batch_invariant import LLM
    print(f"l13_launches: {os.path.basename(path)}: prefill, then one decode step ...", file=sys.stderr, flush=True)
    made = {}

    def prefill():
        eng = made["engine"] = LLM(path, device="cpu", dtype=torch.bfloat16, batch_invariant=True, max_model_len=1024,
                                   num_gpu_blocks_override=a.batch * 40 + 64, max_num_seqs=a.batch).llm_engine
        for i in range(a.batch):
            eng.add_request({"prompt_token_ids": [1 + (i + j) % 200 for j in range(512)]},
                            SamplingParams(max_tokens=4, ignore_eos=True), request_id=f"r{i}")
        while any(not r.output_ids for r in eng.requests.values()):
            eng.step()
    launches = compile_launches(prefill) + (decode := compile_launches(lambda: made["engine"].step()))
    failed = sorted({f"{r.kernel}: {r.error}" for r in launches if r.error})
    if failed:
        sys.exit("l13_launches: a kernel did not compile for sm_90, so the count would not be the engine's:\n"
                 + "\n".join(failed))
    return collections.Counter(r.kernel for r in decode)


if __name__ == "__main__":
    sys.exit(main())
