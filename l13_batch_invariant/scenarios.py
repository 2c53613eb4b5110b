"""The situations in which a request's logits may depend on what else the engine did, each run as a
pair: the request undisturbed (alone, whole prompt, no preemption, no cache hit, no speculation),
and disturbed. With ``batch_invariant`` every step's logits must be the same bits in both; without
it some differ (the wall lesson 13 measures: scripts/l13_wall.py). Run by tests/test_l13_gpu.py (a
GPU, bf16, Qwen3-0.6B's shape), tests/test_l13_engine.py (the CPU, float32, tiny Qwen3) and the
script.

    scenario     undisturbed                       disturbed
    batch N      TARGET alone                      TARGET with N - 1 other requests, same steps
    chunked      whole prompt in one step          prompt in chunks of CHUNK tokens
    preempted    a pool that holds everything      a pool so small TARGET is preempted and recomputed
    prefix hit   first request (a cache miss)      the same prompt again (its blocks from the cache)
    spec k       plain decoding                    n-gram speculation, k guesses (or a draft model)
"""
from __future__ import annotations

import random

import torch

NEW = 16                                     # greedy tokens per request
CHUNK = 32


def prompts(vocab: int, n: int, lo: int = 40, hi: int = 100, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def target(vocab: int) -> list[int]:
    """A prompt with repeats, so that n-gram speculation finds guesses."""
    rng = random.Random(0)
    motif = [rng.randrange(vocab) for _ in range(12)]
    return (motif * 12)[:140]


class Runner:
    """Engines by options, built once each (``make(**options)`` -> LLM), and one request's logits."""

    def __init__(self, make):
        self.make, self.engines, self.n = make, {}, 0

    def engine(self, **options):
        key = tuple(sorted((k, repr(v)) for k, v in options.items()))
        if key not in self.engines:
            self.engines[key] = self.make(**options).llm_engine
        return self.engines[key]

    def run(self, eng, batch: list[list[int]], new: int = NEW, which: int = 0):
        """Request ``which``'s (token ids, logits per step, the request) of ``batch``, all added at once."""
        from l4_sampler.params import SamplingParams
        ids = []
        for q in batch:
            self.n += 1
            ids.append(eng.add_request({"prompt_token_ids": q}, SamplingParams(temperature=0, max_tokens=new,
                                                                               ignore_eos=True),
                                       request_id=f"s{self.n}"))
        while eng.has_unfinished_requests():
            eng.step()
        req = eng.requests[ids[which]]
        if len(req.logits) != new:                   # (two empty lists would compare equal)
            raise AssertionError(f"{len(req.logits)} steps' logits kept for {new} tokens: keep_logits=True?")
        return list(req.output_ids), [t.float().cpu() for t in req.logits], req


def same(a, b) -> bool:
    """Every step's logits the same bits (and so the same tokens)."""
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def scenarios(r: Runner, vocab: int, batches=(2, 16, 128), ks=(1, 2, 3, 4, 5), draft: str | None = None,
              **base) -> dict:
    """scenario name -> (undisturbed, disturbed) result pairs, as ``Runner.run`` returns them."""
    t, others = target(vocab), prompts(vocab, max(batches))
    eng = r.engine(enable_prefix_caching=False, **base)                # (base may not name the sizes varied here)
    alone = r.run(eng, [t])
    out = {f"batch {n}": (alone, r.run(eng, [t] + others[:n - 1])) for n in batches}
    chunked = r.engine(enable_prefix_caching=False, max_num_batched_tokens=CHUNK, max_num_seqs=CHUNK, **base)
    out["chunked"] = (alone, r.run(chunked, [t]))                # (a budget below max_num_seqs is refused)
    crowd, bs = others[:3] + [t], eng.config.block_size     # TARGET last: the first to be preempted
    pool = sum(-(-len(q) // bs) for q in crowd)              # every prompt fits, and the first block a decode
    tight = r.engine(enable_prefix_caching=False, **dict(base, num_gpu_blocks_override=pool, max_model_len=256))
    preempted = r.run(tight, crowd, which=-1)                # needs is not there: the last one running goes
    if preempted[2].num_preemptions == 0:
        raise AssertionError(f"a pool of {pool} blocks did not preempt the target: the scenario did not happen")
    out["preempted"] = (alone, preempted)
    cached = r.engine(enable_prefix_caching=True, **base)
    first = r.run(cached, [t])
    hits = cached.scheduler.kv.stats.hits
    second = r.run(cached, [t])
    if cached.scheduler.kv.stats.hits == hits:
        raise AssertionError("the second request found nothing in the prefix cache: the scenario did not happen")
    out["prefix hit"] = (first, second)
    specs = {f"ngram k={k}": dict(method="ngram", num_speculative_tokens=k, prompt_lookup_min=2, prompt_lookup_max=5)
             for k in ks}
    if draft is not None:
        specs["draft k=3"] = dict(method="draft_model", model=draft, num_speculative_tokens=3)
    for name, spec in specs.items():
        eng = r.engine(enable_prefix_caching=False, speculative_config=spec, **base)
        verified = eng.step_order.speculator.verify_steps
        out[name] = (alone, r.run(eng, [t]))
        if eng.step_order.speculator.verify_steps == verified:
            raise AssertionError(f"{name}: no step verified a guess: the scenario did not happen")
    return out


def model_for(device: str) -> tuple[str, int, torch.dtype]:
    """(checkpoint, vocab, dtype) of the lesson's runs: tiny Qwen3 in float32 on a CPU (the
    interpreter), a random-weight Qwen3-0.6B shape in bf16 on a GPU (built once, out/l13_wall/)."""
    if device == "cpu":
        return "tiny-qwen3", 256, torch.float32
    if not torch.cuda.is_available():
        from plumbing.errors import UserError
        raise UserError("--device cuda: no GPU is visible (leave --device out for the CPU run)")
    import os

    from harness.random_checkpoint import build_checkpoint
    out = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "out", "l13_wall")
    return build_checkpoint(os.path.join(out, "qwen3-0.6b-random"), "Qwen/Qwen3-0.6B"), 151936, torch.bfloat16


def differing(pairs: dict) -> list[str]:
    return [name for name, (a, b) in pairs.items() if not same(a, b)]
