"""One engine step in stage 5's order: each step waits for its own tokens.

    out  = scheduler.schedule()            who runs, how many tokens each
    ran  = runner.execute(out)             ONE forward pass: logits for the rows that sample
    scheduler.advance(out)                 the scheduled tokens' K/V are in the cache
    so   = sampler(logits, rows)           ONE sampler call, per-row SamplingParams
    scheduler.update_from_output(...)      the tokens join their requests: stop checks, blocks freed

A step order is a part (the engine calls ``step(engine)``); a later stage may give the engine
another order of the same work. Every order hands its tokens to ``update_from_output`` in a
``ModelRunnerOutput`` (``sampled_output`` makes one from a sampler call).
"""
from __future__ import annotations

from .outputs import ModelRunnerOutput


def sampled_output(reqs, so, logits, keep_logits: bool) -> ModelRunnerOutput:
    """One sampler call's tokens as a ModelRunnerOutput: one new token per request (``logits``:
    its rows, copied to the CPU if the engine keeps them)."""
    return ModelRunnerOutput(reqs, [[t] for t in so.token_ids_list],
                             [[lp] for lp in so.logprobs] if so.logprobs else None,
                             [[row.cpu()] for row in logits] if keep_logits else None)


class PlainStep:
    def __call__(self, engine):
        sched = engine.scheduler
        out = sched.schedule()
        if not out.scheduled:
            raise RuntimeError("the scheduler scheduled nothing with requests waiting: this is a bug")
        ran = engine.runner.execute(out)                     # logits [S', V] float32, meta, argmax
        engine.last_meta = ran.meta                          # for --trace-meta and tests
        running, waiting = len(sched.running), len(sched.waiting)   # before anyone finishes
        sched.advance(out)
        sampling = [req for (req, _), s in zip(out.scheduled, out.sample) if s]
        results, finished = [], []
        if sampling:
            so = engine.sampler(ran.logits, [req.row for req in sampling], ran.argmax)
            results, finished = sched.update_from_output(sampled_output(sampling, so, ran.logits, engine.keep_logits))
        engine.record(out, running, waiting, len(sampling), finished)
        return results
