"""One engine step in stage 5's order: each step waits for its own tokens.

    out  = scheduler.schedule()            who runs, how many tokens each
    ran  = runner.execute(out)             ONE forward pass: logits for the rows that sample
    scheduler.advance(out)                 the scheduled tokens' K/V are in the cache
    so   = sampler(logits, rows)           ONE sampler call, per-row SamplingParams
    scheduler.update_from_output(...)      the tokens join their requests: stop checks, blocks freed

A step order is a part (the engine calls ``step(engine)``); a later stage may give the engine
another order of the same work. Every order hands its tokens to ``update_from_output`` in a
``ModelRunnerOutput`` (``sampled_output`` makes one from a sampler call), and hands the prompt
rows a request's ``prompt_logprobs`` asked for to ``take_prompt_logprobs`` (only prefill steps have any).
"""
from __future__ import annotations

from .outputs import ModelRunnerOutput
from .request import RequestStatus


def take_prompt_logprobs(out, ran) -> None:
    """prompt_logprobs: score the prompt rows the runner computed (``ran.prompt_logits``, one host sync)
    and append them to their requests, in position order (request.prompt_logits_rows)."""
    if ran.prompt_logits is None:
        return
    from l4_sampler.logprobs import prompt_token_logprobs
    owed = [(req, e) for (req, _), e in zip(out.scheduled, out.prompt_rows) if e]
    targets = [t for req, e in owed for t in req.prompt_ids[len(req.prompt_logprobs) + 1:][:e]]
    lps = prompt_token_logprobs(ran.prompt_logits, targets, [req.params.prompt_logprobs for req, e in owed for _ in
                                                             range(e)])
    at = 0
    for req, e in owed:
        if req.status != RequestStatus.FINISHED:           # (aborted meanwhile: nothing to keep)
            req.prompt_logprobs += lps[at:at + e]
        at += e


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
        take_prompt_logprobs(out, ran)
        running, waiting = len(sched.running), len(sched.waiting)   # before anyone finishes
        sched.advance(out)
        sampling = [req for (req, _), s in zip(out.scheduled, out.sample) if s]
        results, finished = [], []
        if sampling:
            so = engine.sampler(ran.logits, [req.row for req in sampling], ran.argmax)
            results, finished = sched.update_from_output(sampled_output(sampling, so, ran.logits, engine.keep_logits))
        engine.record(out, running, waiting, len(sampling), finished)
        return results
