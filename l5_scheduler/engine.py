"""The engine loop, written once: add requests, then ``step()`` until none is left.

The engine is given its parts (vLLM v1: one engine core, one Scheduler, one model runner):

    scheduler   who runs this step and how many tokens each (scheduler.py), with the KV manager
                it was given (kv_manager.py: stage 2's allocator; lesson 6: a prefix cache)
    runner      one forward pass for the scheduled tokens (runner.py; lesson 7: a faster one)
    sampler     stage 4's Sampler: one call for every row that samples

and runs the same loop whichever parts it has. One step:

    out    = scheduler.schedule()          which requests run, how many tokens each (host ints)
    ran    = runner.execute(out)           ONE forward pass: logits [S', V] for the rows that
                                           sample (decodes, last prefill chunks), and the metadata
    scheduler.advance(out)                 the new tokens' K/V are cached
    tokens = sampler(logits, rows)         ONE stage 4 sampler call, per-row SamplingParams
    per sampled request: append the token, stop checks; a finished request frees its blocks now

With a ``speculator`` (lesson 11) a decoding request also carries drafts, guessed next tokens that
the same forward pass computes; the speculator samples at every one of them, keeps the guesses the
model agrees with, and ``advance`` is told how many it refused. Without one nothing changes.
With ``async_scheduling`` (lesson 7) the same work runs in another order, so the
host's part of a step hides behind the GPU's (``_step_overlapped``).

The stop checks ask a request's StopChecker only for a token that could end it (stage 4's
pre-check: ``token in stop_ids or num_tokens >= stop_len``). Each stage's builder of the parts is
``build_engine`` in its llm.py.

``add_request`` checks a request completely before it joins (prompt, ids, params, limits), so a
bad one fails alone with a UserError and the requests in flight never notice. A request with
``n > 1`` joins as n sequences (vLLM's ids ``"{k}_{id}"``, seeds ``seed + k``) that the prefix
cache, from lesson 6, lets share the prompt's blocks; ``output(id)`` gathers them, by index.

A request leaves in one of two ways. ``release(id)`` hands back a finished request's output and
forgets it; ``abort_request(ids)`` takes unfinished ones out now, blocks freed (a client that went
away, an interrupted ``generate``). A long-lived engine then holds nothing for them; with
``keep_stats = False`` (a server) it keeps no per-step record either.
"""
from __future__ import annotations

import dataclasses

import torch

from l4_sampler.params import SamplingParams
from l4_sampler.sampler import RowState, to_device
from l4_sampler.stops import StopChecker
from plumbing.errors import UserError

from .config import EngineConfig
from .outputs import RequestOutput, StepOutput, StepStats, completion, step_stats
from .request import Request, RequestStatus, prompt_token_ids


class LLMEngine:
    def __init__(self, model, tokenizer, config: EngineConfig, *, scheduler, runner, sampler,
                 speculator=None, keep_logits: bool = False, async_scheduling: bool = False):
        if async_scheduling and speculator is not None:
            raise UserError("async scheduling cannot run with speculative decoding (a draft needs the token "
                            "before it): pass async_scheduling=False.")
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.scheduler, self.runner, self.sampler = scheduler, runner, sampler
        self.speculator = speculator                # lesson 11: proposes drafts, verifies them
        self.keep_logits = keep_logits              # per-token logits kept on CPU (checks, not serving)
        self.requests: dict[str, Request] = {}
        self.groups: dict[str, list[str]] = {}      # a request with n > 1: its sequences' ids, by index
        self.stats: list[StepStats] = []
        self.keep_stats = True                      # one StepStats per step (benchmarks, --trace)
        self._counter = 0
        self.last_meta = None
        self.overlap, self._pending = async_scheduling, None   # lesson 7: the step order; a sampler call in flight

    # ---- requests in ------------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def prompt_ids(self, prompt) -> list[int]:
        """A string (needs a tokenizer) or ``{"prompt_token_ids": [...]}`` -> checked ids."""
        return prompt_token_ids(prompt, self.tokenizer, self.model.cfg.vocab_size)

    def make_request(self, prompt, params: SamplingParams | None = None, request_id: str | None = None) -> Request:
        """Build and check a request without adding it (``generate`` checks them all first)."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise UserError(f"sampling params must be a SamplingParams, got {type(params).__name__}: "
                            "build one with SamplingParams(temperature=..., max_tokens=...).")
        ids = self.prompt_ids(prompt)
        V, cfg = self.model.cfg.vocab_size, self.config
        bad = [t for t in params.stop_token_ids if t >= V]
        if bad:
            raise UserError(f"stop_token_ids {bad} are outside the vocabulary [0, {V}).")
        if params.stop and self.tokenizer is None:
            raise UserError("stop strings need a tokenizer to decode text, and this checkpoint has none: use stop_token_ids.")
        need = len(ids) + params.max_tokens
        limits = [(cfg.capacity, 0, f"the KV pool ({cfg.num_blocks} blocks x {cfg.block_size} tokens)",
                   "raise num_gpu_blocks_override"),
                  (cfg.max_model_len, 1, "max_model_len", "raise max_model_len (up to the model's context)")]
        for limit, _, what, fix in sorted(limits):          # name the tighter limit (the pool on a tie)
            if need > limit:
                raise UserError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {need} exceeds {what} "
                                f"= {limit} tokens; this request could never run: shorten the prompt, lower max_tokens, "
                                f"or {fix}.")
        rid = self._new_id(request_id)
        req = Request(rid, ids, params, arrival=self._counter)
        self._counter += 1                                   # arrival order = order of creation
        eos = self.model.cfg.eos_token_ids
        req.row = RowState(params, req.prompt_ids, req.output_ids, tuple(eos))   # shares output_ids
        req.stops = StopChecker(params, len(ids), cfg.max_model_len, eos, self._decode if params.stop else None)
        return req

    def _new_id(self, request_id: str | None) -> str:
        rid = request_id if request_id is not None else f"r{self._counter}"
        if rid in self.requests or rid in self.groups:
            raise UserError(f"request id {rid!r} is already in use: pick another.")
        return rid

    def make_requests(self, prompt, params: SamplingParams | None = None,
                      request_id: str | None = None) -> tuple[str, list[Request]]:
        """The id and the sequences of one request: one, or ``params.n`` (vLLM's fan-out), all checked."""
        if params is None or not isinstance(params, SamplingParams) or params.n == 1:
            req = self.make_request(prompt, params, request_id)
            return req.request_id, [req]
        rid, ids = self._new_id(request_id), {"prompt_token_ids": self.prompt_ids(prompt)}
        seed = params.seed
        return rid, [self.make_request(ids, dataclasses.replace(params, n=1, seed=None if seed is None else seed + k),
                                       f"{k}_{rid}") for k in range(params.n)]

    def add(self, req: Request) -> str:
        self.scheduler.add(req)
        self.requests[req.request_id] = req
        return req.request_id

    def add_group(self, rid: str, reqs: list[Request]) -> str:
        for req in reqs:
            self.add(req)
        if len(reqs) > 1:                           # n > 1: the sequences' ids, by index
            self.groups[rid] = [req.request_id for req in reqs]
        return rid

    def add_request(self, prompt, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        return self.add_group(*self.make_requests(prompt, params, request_id))

    def abort_request(self, request_ids) -> None:
        """Take these requests out now (unknown or finished ids are ignored, as in vLLM): their
        blocks go back to the pool and the engine forgets them."""
        for rid in [request_ids] if isinstance(request_ids, str) else list(request_ids):
            for sid in self.groups.pop(rid, [rid]):
                req = self.requests.pop(sid, None)
                if req is not None:
                    self.scheduler.abort(req)

    def release(self, request_id: str) -> RequestOutput:
        """A finished request's output; the engine then forgets the request (a server's memory stays flat)."""
        out = self.output(request_id)
        if not out.finished:
            raise UserError(f"request {request_id!r} has not finished: step() until it has, or abort_request() it.")
        for sid in self.groups.pop(request_id, [request_id]):
            del self.requests[sid]
        return out

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        if self.overlap:
            return self._step_overlapped()                   # lesson 7
        sched = self.scheduler
        out = sched.schedule()
        if not out.scheduled:
            raise RuntimeError("the scheduler scheduled nothing with requests waiting: this is a bug")
        ran = self.runner.execute(out)                       # logits [S', V] float32, meta, argmax
        self.last_meta = ran.meta                            # for --trace-meta and tests
        running, waiting = len(sched.running), len(sched.waiting)   # before anyone finishes
        sampling = [req for (req, _), s in zip(out.scheduled, out.sample) if s]
        spec = self.speculator
        if spec is not None and any([req.spec_ids for req in sampling]):
            results, finished = self._verify(out, ran, sampling)         # lesson 11
        else:
            sched.advance(out)
            so = self.sampler(ran.logits, [req.row for req in sampling], ran.argmax) if sampling else None
            results, finished = self._stop_checks(self._take(sampling, so, ran.logits, False)) if so else ([], [])
        if spec is not None:
            spec.propose(sched.running)                      # guesses for the next step
        if self.keep_stats:
            self.stats.append(step_stats(self, out, running, waiting, len(sampling), finished))
        return results

    def _step_overlapped(self) -> list[StepOutput]:
        """Lesson 7's order of the same work (vLLM's async scheduling): step n+1 is scheduled and
        launched before the host waits for step n's tokens (the runner copies them into its inputs
        on the device: ``fill_pending``), and their stop checks run while the GPU computes. A request
        that stopped at step n computes one wasted token in step n+1 (its row is dropped); one that
        ends by length is not scheduled again."""
        sched, pend = self.scheduler, self._pending
        out = sched.schedule()                               # step n+1, the GPU still on step n
        if not out.scheduled:                                # the rest are finishing: the runner hears
            if pend is None:                                 # of those that finished with the next step
                raise RuntimeError("the scheduler scheduled nothing with requests waiting: this is a bug")
            sched.finished_ids[:0] = out.finished_ids
        ran = self.runner.execute(out) if out.scheduled else None   # launched: the GPU runs while...
        so = pend[1].result() if pend is not None else None  # ...the host waits for step n's tokens,
        self._pending = None                                 # (interrupted before here: still in flight)
        got = self._take(pend[0], so, pend[2], True) if pend is not None else []
        running, waiting = len(sched.running), len(sched.waiting)
        sampling = [req for (req, _), s in zip(out.scheduled, out.sample) if s]
        if ran is not None:
            self.last_meta = ran.meta
            sched.advance(out)                               # (the cache hashes blocks: tokens known now)
        results, finished = self._stop_checks(got)           # ...and checks them
        live = [k for k, req in enumerate(sampling) if req.status == RequestStatus.RUNNING]
        if live:
            logits, argmax = ran.logits, ran.argmax
            if len(live) < len(sampling):                    # a row whose request just stopped: dropped
                idx = to_device(live, torch.int64, logits.device)   # (pinned: no wait for the GPU)
                logits, argmax = logits[idx], None if argmax is None else argmax[idx]
            reqs = [sampling[k] for k in live]
            sampled = self.sampler.launch(logits, [req.row for req in reqs], argmax)
            self._pending = (reqs, sampled, logits.clone() if self.keep_logits else None)   # (a graph's
            for k, req in enumerate(reqs):                   # logits are overwritten by the next replay)
                req.num_tokens += 1                          # counted now, appended by the next step
                req.pending = (sampled.ids, k)
        if self.keep_stats and out.scheduled:
            self.stats.append(step_stats(self, out, running, waiting, len(live), finished))
        return results

    def _take(self, sampling: list[Request], so, logits, counted: bool) -> list[tuple[Request, int]]:
        """Each sampled request's new token (and logprob); ``counted``: already in num_tokens."""
        got = []
        for i, (req, tok) in enumerate(zip(sampling, so.token_ids_list)):
            if counted:
                req.pending = None
                if req.status == RequestStatus.FINISHED:     # aborted while its token was sampled
                    continue
            else:
                req.num_tokens += 1
            req.output_ids.append(tok)                       # Request.append_output, inlined (hot path;
            if so.logprobs and so.logprobs[i] is not None:   # the RowState shares the list)
                req.logprobs.append(so.logprobs[i])
                req.cumulative_logprob += so.logprobs[i].logprob
            if self.keep_logits:
                req.logits.append(logits[i].cpu())
            got.append((req, tok))
        return got

    def _stop_checks(self, got: list[tuple[Request, int]]) -> tuple[list[StepOutput], list[str]]:
        results, finished = [], []
        for req, tok in got:
            stops, fin = req.stops, None
            if tok in stops.stop_ids or req.num_tokens >= stops.stop_len:   # could it end here?
                fin = stops.update(req.output_ids)
                if fin is not None:
                    self.scheduler.finish(req, fin.finish_reason, fin.stop_reason)   # blocks freed now
                    finished.append(req.request_id)
            results.append(StepOutput(req.request_id, [tok], fin is not None, fin and fin.finish_reason))
        return results, finished

    def _verify(self, out, ran, sampling: list[Request]) -> tuple[list[StepOutput], list[str]]:
        """Lesson 11: the speculator turns each sampling row's logits into its new tokens (the drafts
        the model agrees with, then one of its own); the scheduler keeps only those tokens' K/V."""
        new, lps, rows = self.speculator.verify(ran.logits, sampling, self.sampler, ran.argmax)
        it = iter(new)
        self.scheduler.advance(out, [len(req.spec_ids) + 1 - len(next(it)) if s else 0
                                     for (req, _), s in zip(out.scheduled, out.sample)])
        results, finished = [], []
        for i, req in enumerate(sampling):
            req.spec_ids.clear()
            fin, got, stops = None, [], req.stops
            for j, tok in enumerate(new[i]):
                req.output_ids.append(tok)
                req.num_tokens += 1
                got.append(tok)
                if lps is not None and lps[i][j] is not None:
                    req.logprobs.append(lps[i][j])
                    req.cumulative_logprob += lps[i][j].logprob
                if self.keep_logits:
                    req.logits.append(ran.logits[rows[i][j]].cpu())
                if tok in stops.stop_ids or req.num_tokens >= stops.stop_len:
                    fin = stops.update(req.output_ids)
                    if fin is not None:                      # the tokens after a stop are dropped
                        self.scheduler.finish(req, fin.finish_reason, fin.stop_reason)
                        finished.append(req.request_id)
                        break
            results.append(StepOutput(req.request_id, got, fin is not None, fin and fin.finish_reason))
        return results, finished

    # ---- results out ------------------------------------------------------------------------
    def output(self, request_id: str) -> RequestOutput:
        """What a request has so far (n > 1: its sequences, by index)."""
        sids = self.groups.get(request_id, [request_id])
        if sids[0] not in self.requests:
            raise UserError(f"no request {request_id!r} in this engine (released, aborted, or never added).")
        reqs = [self.requests[sid] for sid in sids]
        comps = [completion(k, req, self._decode if self.tokenizer is not None else None) for k, req in enumerate(reqs)]
        done = all(req.status == RequestStatus.FINISHED for req in reqs)
        prompt = self._decode(reqs[0].prompt_ids) if self.tokenizer is not None else None
        return RequestOutput(request_id, prompt, list(reqs[0].prompt_ids), comps, done,
                             sum(req.num_preemptions for req in reqs))
