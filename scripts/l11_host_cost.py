"""The engine loop's host time per step with speculation, without a model: does it grow with the
tokens a step emits?

    python scripts/l11_host_cost.py                  # k 4, 512 tokens, alpha 0 and 1 (CPU, a few seconds)

Every part is the real one (stage 5's scheduler and loop, stage 6's prefix-caching KV manager,
stage 4's sampler, stage 11's speculator and replay drafter) except the runner, which returns
logits whose argmax is a fixed continuation (and that argmax, as stage 7's graphs do). Alpha 1:
every guess is that continuation (k + 1 tokens a step); alpha 0: every guess is wrong (1 token a
step). The output is checked against the continuation, so a step that emitted wrong tokens fails.
"""
from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

from plumbing.cli import run_main

V = 1000


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=4, help="guesses per step (default 4)")
    ap.add_argument("--tokens", type=int, default=512, help="tokens generated (default 512)")
    return ap.parse_args(argv)


class GivenLogits:
    """A runner whose logits at position p say: the next token is ``cont[p + 1 - P]``."""

    def __init__(self, cont, prompt_len):
        self.cont, self.P = cont, prompt_len

    def execute(self, out):
        import torch
        from l5_scheduler.runner import RunnerOutput
        tops = [self.cont[p + 1 - self.P]                       # a request's last ``s`` positions sample
                for (req, n), s in zip(out.scheduled, out.sample)
                for p in range(req.kv.cur_len + n - s, req.kv.cur_len + n)]
        logits = torch.zeros(len(tops), V)
        logits[torch.arange(len(tops)), torch.tensor(tops)] = 1.0
        return RunnerOutput(logits, None, logits.argmax(-1))


def per_step_ms(rate: float, k: int, n: int) -> tuple[float, float]:
    from l4_sampler.params import SamplingParams
    from l4_sampler.sampler import Sampler
    from l5_scheduler.config import EngineConfig
    from l5_scheduler.engine import LLMEngine
    from l5_scheduler.scheduler import Scheduler
    from l6_prefix_cache.kv_manager import KVCacheManager
    from l11_spec_decode.drafters import ReplayDrafter
    from l11_spec_decode.speculator import Speculator
    from l11_spec_decode.step import SpeculativeStep
    prompt = [1, 2, 3, 4] * 32
    cont = [(i * 7 + 3) % V for i in range(n + 8)]
    spec = Speculator(ReplayDrafter({tuple(prompt): cont}, rate, V), k, 100_000, 8)
    model = SimpleNamespace(cfg=SimpleNamespace(vocab_size=V, eos_token_ids=()))
    runner = GivenLogits(cont, len(prompt))
    eng = LLMEngine(model, None, EngineConfig(16, 4096, 8192, 64, 100_000), scheduler=Scheduler(KVCacheManager(4096, 16),
                    8192, 64), runner=runner, sampler=Sampler(0), step=SpeculativeStep(spec, runner))
    eng.keep_stats = False
    rid = eng.add_request({"prompt_token_ids": prompt}, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    eng.step()                                        # the prefill, not timed
    steps, t0 = 0, time.perf_counter()
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
    dt = time.perf_counter() - t0
    if eng.requests[rid].output_ids != cont[:n]:
        raise SystemExit(f"alpha {rate}: the engine emitted other tokens than the given continuation (a bug)")
    return dt / steps * 1e3, (n - 1) / steps


def main(argv=None) -> int:
    args = parse(argv)
    for rate in (0.0, 1.0):
        ms, tps = per_step_ms(rate, args.k, args.tokens)
        print(f"alpha {rate:.0f}: {ms:.3f} ms of host time per step, {tps:.2f} tokens per step, "
              f"{ms / tps:.3f} ms per token (k {args.k}, {args.tokens} tokens)")
    return 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main(sys.argv[1:])))
