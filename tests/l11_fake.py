"""A fake model for driving the real engine loop with speculation on (stage 5's LLMEngine and
Scheduler, stage 6's prefix-caching KV manager, stage 4's Sampler, stage 11's speculative step
order and Speculator) without a network. Used by tests/test_l11_fuzz.py.

As in tests/l6_fake.py the fake KV cache is a dict ``slot -> (position, token)``. The fake runner
writes every scheduled token (guesses included) into its slot; at every position that samples (the
last known token and each guess) it "attends" by reading positions 0..p back through the slot list,
and checks each slot holds the request's token at that position: a guess refused in an earlier
step and still counted, cached or read shows up here. Its logits put the top score on a hash of
what it read (tests/l5_fake.py's ``next_token``), so greedy outputs must equal the solo run.

The fake drafter guesses the true continuation with probability ``rate`` and a wrong token
otherwise, so every run has accepted and refused guesses.

The invariants (tests/test_l11_fuzz.py):
    no refused guess is ever read: every position a step reads holds the request's own token
    no refused guess is counted as computed: num_computed_tokens <= num_tokens after every step
    outputs equal the solo run, however chunked, preempted, prefix-hit or speculated
    every request finishes; at the end every block is free or cached
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from l4_sampler.params import SamplingParams
from l4_sampler.sampler import Sampler
from l5_fake import EOS, V, next_token, solo
from l5_fake import _check as l5_check
from l5_scheduler.config import EngineConfig
from l5_scheduler.engine import LLMEngine
from l5_scheduler.runner import RunnerOutput
from l5_scheduler.scheduler import Scheduler
import l6_fake
from l6_fake import prompt_of
from l6_prefix_cache.kv_manager import KVCacheManager
from l11_spec_decode.speculator import Speculator
from l11_spec_decode.step import SpeculativeStep
from plumbing.errors import UserError

CHECKS: Counter = Counter()
EXAMPLES: Counter = Counter()


@dataclass
class Workload(l6_fake.Workload):                     # stage 6's workload, and the guesses
    k: int = 3                                        # guesses per step
    rate: float = 0.6                                 # how often a guess is the true token
    seed: int = 0


def _check(name: str, ok: bool, detail="") -> None:          # detail: a string, or a function making it
    l5_check(name, ok, detail, CHECKS)


class FakeRunner:
    def __init__(self):
        self.store: dict = {}

    def execute(self, out) -> RunnerOutput:
        tops = []
        for (req, n), sample in zip(out.scheduled, out.sample):
            start, slots = req.kv.cur_len, req.kv.slot_indices
            for j, t in enumerate(self.tokens(req, start, n)):
                self.store[slots[start + j]] = (start + j, t)
            for p in range(start + n - sample, start + n):     # its last ``sample`` positions (the runner's rule)
                tops.append(next_token(self.read(req, p)))
        logits = torch.zeros(len(tops), V)
        logits[torch.arange(len(tops)), torch.tensor(tops, dtype=torch.int64)] = 1.0
        return RunnerOutput(logits, None)

    def tokens(self, req, start: int, n: int) -> list[int]:
        return req.tokens(start, n)

    def read(self, req, p: int) -> list[int]:
        want = self.tokens(req, 0, p + 1)
        got = [self.store.get(req.kv.slot_indices[q]) for q in range(p + 1)]
        bad = next((q for q in range(p + 1) if got[q] != (q, want[q])), None)
        _check("no refused guess is ever read: every position a step reads holds the request's own token",
               bad is None, lambda: f"{req.request_id} position {bad}: slot holds {got[bad] if bad is not None else None}, "
                            f"want {(bad, want[bad]) if bad is not None else None}")
        return want


class FakeDrafter:
    def __init__(self, rate: float, seed: int):
        self.rate, self.rng = rate, random.Random(seed)

    def propose(self, reqs, ks):
        out = []
        for req, k in zip(reqs, ks):
            toks, guesses = req.prompt_ids + req.output_ids, []
            for _ in range(k):
                true = next_token(toks + guesses)
                guesses.append(true if self.rng.random() < self.rate else (true + 1 + self.rng.randrange(V - 1)) % V)
            out.append(guesses)
        return out

    def retain(self, ids):
        pass


def build(w: Workload, step_cls=SpeculativeStep, speculator_cls=Speculator) -> LLMEngine:
    config = EngineConfig(w.block_size, w.num_blocks, w.budget, w.max_num_seqs, 100_000)
    model = SimpleNamespace(cfg=SimpleNamespace(vocab_size=V, eos_token_ids=(EOS,)))
    spec = speculator_cls(FakeDrafter(w.rate, w.seed), w.k, config.max_model_len, disable_by_batch_size=1 << 20)
    runner = FakeRunner()
    return LLMEngine(model, None, config, scheduler=Scheduler(KVCacheManager(w.num_blocks, w.block_size), w.budget,
                                                              w.max_num_seqs),
                     runner=runner, sampler=Sampler(0), step=step_cls(spec, runner))


def arrivals(w) -> list:
    """The workload's requests in arrival order: (step, index, doc, shared, own, max_tokens)."""
    return sorted(((a, i, d, s, o, m) for i, (d, s, o, m, a) in enumerate(w.requests)), key=lambda x: x[:2])


def arrive(eng, pending: list, step: int, expect: dict) -> dict:
    """Add the requests due by ``step`` (greedy); ``expect[rid]`` = the solo run. Returns {index: rid}."""
    added = {}
    while pending and pending[0][0] <= step:
        _, i, d, s, o, mt = pending.pop(0)
        prompt = prompt_of(i, d, s, o)
        try:
            rid = eng.add_request({"prompt_token_ids": prompt}, SamplingParams(max_tokens=mt, temperature=0))
        except UserError:                       # longer than the whole pool: refused at add
            continue
        expect[rid], added[i] = solo(prompt, mt), rid
    return added


def run(w: Workload, step_cls=SpeculativeStep, speculator_cls=Speculator, max_steps: int = 20_000) -> dict:
    eng = build(w, step_cls, speculator_cls)
    sched = eng.scheduler
    pending = arrivals(w)
    expect, step = {}, 0
    while pending or eng.has_unfinished_requests():
        arrive(eng, pending, step, expect)
        if eng.has_unfinished_requests():
            _check("every request finishes (progress every step)", step < max_steps, lambda: f"step {step}")
            eng.step()
            for req in sched.running:
                _check("no refused guess is counted as computed: num_computed_tokens <= num_tokens after every step",
                       req.kv.cur_len <= req.num_tokens, lambda: f"{req.request_id}: {req.kv.cur_len} > {req.num_tokens}")
        step += 1
    for rid, want in expect.items():
        got = eng.requests[rid].output_ids
        _check("outputs equal the solo run, however chunked, preempted, prefix-hit or speculated", got == want,
               lambda: f"{rid}: {got} != {want}")
    _check("every request finishes; at the end every block is free or cached", sched.kv.num_free == w.num_blocks)
    spec = eng.step_order.speculator
    for key, v in (("workloads", 1), ("steps", step), ("requests", len(expect)), ("guesses", spec.drafted),
                   ("guesses accepted", spec.accepted), ("cached tokens reused", sched.kv.stats.hits)):
        EXAMPLES[key] += v
    return {"steps": step, "drafted": spec.drafted, "accepted": spec.accepted, "hits": sched.kv.stats.hits,
            "preemptions": sum(r.num_preemptions for r in eng.requests.values())}
