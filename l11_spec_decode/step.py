"""A speculative step: stage 5's step order, with the speculator's guesses joined to the plan.

    out = scheduler.schedule()            stage 5's plan: a decoding request computes 1 token
    join(out)                             each decoding request with guesses computes 1 + k: its
                                          last known token and k guesses, k cut to the budget the
                                          plan left and to the free blocks (a guess never preempts)
    ran = runner.execute(out)             ONE forward pass, logits at every guess too (the runner
                                          gives a request its chunk's last ``sample`` rows)
    new = speculator.verify(...)          per request: the guesses the target agrees with, then
                                          one token of its own
    scheduler.advance(kept)               only the kept tokens' K/V count: the refused guesses'
                                          sit past num_computed_tokens, where the next step
                                          writes over them; they are never counted, cached or read
    scheduler.update_from_output(new)     the one output path: 1 to k + 1 tokens a request
    speculator.propose(running)           guesses for the next step

The runner sees a request with guesses through ``Drafted``: the request, whose ``tokens`` go on
past its known ones with the guesses. Async scheduling cannot run this order: a guess needs the
token before it on the host.
"""
from __future__ import annotations

import dataclasses

from l2_gather.allocator import OutOfBlocks
from l5_scheduler.outputs import ModelRunnerOutput
from l5_scheduler.step import take_prompt_logprobs


class Drafted:
    """A request as the runner sees it in a verify step: its tokens, then its guesses."""

    def __init__(self, req, drafts: list[int]):
        self.req, self.drafts = req, drafts
        self.request_id, self.kv = req.request_id, req.kv

    @property
    def num_computed_tokens(self) -> int:
        return self.kv.cur_len

    def tokens(self, start: int, n: int) -> list[int]:
        known = self.req.tokens(start, n)
        past = max(0, start - self.req.num_tokens)           # guess 0 is at position num_tokens
        return known + self.drafts[past:past + n - len(known)]

    def __getattr__(self, name):                             # everything else: the request's
        return getattr(self.req, name)


class SpeculativeStep:
    def __init__(self, speculator, eager, graphs=None):
        self.speculator = speculator                         # speculator.py: proposes, verifies
        self.eager = eager                                   # the eager runner: steps with guesses
        self.graphs = graphs                                 # VerifyGraphs (graphs.py), on a GPU

    def __call__(self, engine):
        sched, spec = engine.scheduler, self.speculator
        out = sched.schedule()
        if not out.scheduled:
            raise RuntimeError("the scheduler scheduled nothing with requests waiting: this is a bug")
        reqs = [req for req, _ in out.scheduled]
        drafts = self.join(out, sched)
        ran = self.execute(engine, out, any(drafts))
        engine.last_meta = ran.meta
        take_prompt_logprobs(out, ran)
        running, waiting = len(sched.running), len(sched.waiting)   # before anyone finishes
        idx = [i for i, s in enumerate(out.sample) if s]
        sampling = [reqs[i] for i in idx]
        new, lps, rows = spec.verify(ran.logits, sampling, [drafts[i] for i in idx], engine.sampler, ran.argmax)
        out = dataclasses.replace(out, scheduled=self.computed(out, reqs, drafts, dict(zip(idx, new))))
        sched.advance(out)
        logits = [[ran.logits[r].cpu() for r in rs] for rs in rows] if engine.keep_logits else None
        results, finished = sched.update_from_output(ModelRunnerOutput(sampling, new, lps, logits))
        spec.propose(sched.running)                          # guesses for the next step
        engine.record(out, running, waiting, len(sampling), finished)
        return results

    @staticmethod
    def computed(out, reqs, drafts, new: dict) -> list:
        """The step's (request, tokens whose K/V now count): a request that verified k guesses and
        emitted e tokens keeps 1 + k - (k + 1 - e) = e of its 1 + k (vLLM: num_rejected =
        len(spec) + 1 - len(generated)); the refused guesses' K/V are not computed."""
        return [(req, n - (len(drafts[i]) + 1 - len(new[i])) if i in new else n)
                for i, (req, (_, n)) in enumerate(zip(reqs, out.scheduled))]

    def join(self, out, sched) -> list[list[int]]:
        """Give each decoding request its guesses, in the budget the plan left. Returns them, per
        scheduled request (none for most)."""
        drafts, budget = [[] for _ in out.scheduled], sched.max_num_batched_tokens - out.num_tokens
        for i, ((req, n), s) in enumerate(zip(out.scheduled, out.sample)):
            d = self.speculator.drafts.pop(req.request_id, None)
            k = min(len(d), budget) if d and n == 1 and s else 0
            if k:
                try:
                    sched.kv.reserve(req.kv, req.kv.cur_len + 1 + k)
                except OutOfBlocks:
                    continue                                 # no room: it decodes one token, as usual
                drafts[i] = d[:k]
                out.scheduled[i], out.sample[i] = (Drafted(req, d[:k]), 1 + k), 1 + k
                out.num_tokens, budget = out.num_tokens + k, budget - k
        out.new_blocks += sched.kv.new_blocks                # blocks the guesses took: the runner hears
        sched.kv.new_blocks = []
        return drafts

    def execute(self, engine, out, guessed: bool):
        if not guessed:
            return engine.runner.execute(out)                # stage 7's graphs, or eager
        ran = self.graphs.execute(out) if self.graphs is not None else None
        return ran if ran is not None else self.eager.execute(out)
