"""The engine loop, written once: add requests, then ``step()`` until none is left.

The engine is given its parts (vLLM v1: one engine core, one Scheduler, one model runner), which
the assembler picks from the configuration (assemble.py):

    scheduler   who runs this step and how many tokens each (scheduler.py), with the KV manager
                it was given (kv_manager.py: stage 2's allocator, or a later stage's)
    runner      one forward pass for the scheduled tokens (runner.py, or a later stage's)
    sampler     stage 4's Sampler: one call for every row that samples
    step        the order in which one step uses them (step.py); every order ends in the
                scheduler's ``update_from_output``, the one path by which tokens join requests

and runs the same loop whichever parts it has. Stage 5's step order:

    out    = scheduler.schedule()          which requests run, how many tokens each (host ints)
    ran    = runner.execute(out)           ONE forward pass: logits [S', V] for the rows that
                                           sample (decodes, last prefill chunks), and the metadata
    scheduler.advance(out)                 the new tokens' K/V are cached
    tokens = sampler(logits, rows)         ONE stage 4 sampler call, per-row SamplingParams
    scheduler.update_from_output(...)      per sampled request: append, count, stop checks; a
                                           finished request frees its blocks now

``add_request`` checks a request completely before it joins (prompt, ids, params, limits), so a
bad one fails alone with a UserError and the requests in flight never notice. A request with
``n > 1`` joins as n sequences (vLLM's ids ``"{k}_{id}"``, seeds ``seed + k``); ``output(id)``
gathers them, by index.

A request leaves in one of two ways. ``release(id)`` hands back a finished request's output and
forgets it; ``abort_request(ids)`` takes unfinished ones out now, blocks freed (a client that went
away, an interrupted ``generate``). A long-lived engine then holds nothing for them; with
``keep_stats = False`` (a server) it keeps no per-step record either.
"""
from __future__ import annotations

import dataclasses
import time

from l4_sampler.params import SamplingParams
from l4_sampler.processors import bad_words_ids
from l4_sampler.sampler import RowState
from l4_sampler.stops import StopChecker
from plumbing.errors import UserError

from .config import EngineConfig
from .outputs import RequestOutput, StepOutput, StepStats, completion, prompt_logprobs, request_metrics, step_stats
from .request import Request, RequestStatus, check_encodable, decoder, prompt_token_ids
from .step import PlainStep


class LLMEngine:
    def __init__(self, model, tokenizer, config: EngineConfig, *, scheduler, runner, sampler, step=None,
                 keep_logits: bool = False):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.scheduler, self.runner, self.sampler = scheduler, runner, sampler
        self.step_order = step if step is not None else PlainStep()   # step.py (a later stage may give another)
        self.keep_logits = keep_logits              # per-token logits kept on CPU (checks, not serving)
        self.requests: dict[str, Request] = {}
        self.groups: dict[str, list[str]] = {}      # a request with n > 1: its sequences' ids, by index
        self.stats: list[StepStats] = []
        self.keep_stats = True                      # one StepStats per step (benchmarks, --trace)
        self._counter = 0
        self.last_meta = None

    # ---- requests in ------------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def decoder(self, params: SamplingParams):
        """A request's ``decode(ids) -> str`` (its skip_special_tokens, spaces_between_special_tokens; fast
        tokenizers ignore the second), or None: no tokenizer, or detokenize=False."""
        if self.tokenizer is None or not params.detokenize:
            return None
        return decoder(self.tokenizer, params.skip_special_tokens, params.spaces_between_special_tokens)

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
        if params.truncate_prompt_tokens is not None:       # the last k (vLLM: -1 is max_model_len)
            k = params.truncate_prompt_tokens
            ids = ids[-(cfg.max_model_len if k == -1 else k):]
        for name, tids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias or ()),
                           ("allowed_token_ids", params.allowed_token_ids or ())):
            bad = [t for t in tids if t >= V]
            if bad:
                raise UserError(f"SamplingParams.{name} has token ids {bad[:5]} outside the vocabulary [0, {V}): use "
                                "ids from this model's tokenizer.")
        if (params.stop or params.bad_words) and self.tokenizer is None:
            name = "stop" if params.stop else "bad_words"
            raise UserError(f"SamplingParams.{name} needs a tokenizer for its text, and this checkpoint has none: use "
                            "token ids (stop_token_ids, allowed_token_ids, logit_bias).")
        if params.max_tokens is None:                        # vLLM: the room the context leaves
            params = dataclasses.replace(params, max_tokens=max(1, min(cfg.max_model_len, cfg.capacity) - len(ids)))
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
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = []                         # filled as its prompt is computed (step.py)
        self._counter += 1                                   # arrival order = order of creation
        eos, words = self.model.cfg.eos_token_ids, self.bad_words_ids(params)
        req.row = RowState(params, req.prompt_ids, req.output_ids, tuple(eos), words)   # shares output_ids
        req.stops = StopChecker(params, len(ids), cfg.max_model_len, eos, self.decoder(params) if params.stop else None)
        return req

    def bad_words_ids(self, params: SamplingParams) -> list[list[int]]:
        """params.bad_words as token sequences (l4_sampler/processors.py), each checked."""
        if not params.bad_words:
            return []
        enc = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]   # noqa: E731
        for i, w in enumerate(params.bad_words):
            check_encodable(w, f"SamplingParams.bad_words[{i}]")     # a lone surrogate: the word's fault, a 400
            if not enc(w.lstrip()):
                raise UserError(f"SamplingParams.bad_words: {w!r} tokenizes to no token: remove it.")
        return bad_words_ids(params.bad_words, enc)

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
        req.arrival_time = time.monotonic()
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
        """One step of the engine, in its step order; each request's progress in it."""
        return self.step_order(self)

    def record(self, out, running: int, waiting: int, sampled: int, finished: list[str]) -> None:
        """A step order's record of the step it ran (--trace, benchmarks), if the engine keeps them."""
        if self.keep_stats:
            self.stats.append(step_stats(self, out, running, waiting, sampled, finished))

    # ---- results out ------------------------------------------------------------------------
    def output(self, request_id: str) -> RequestOutput:
        """What a request has so far (n > 1: its sequences, by index)."""
        sids = self.groups.get(request_id, [request_id])
        if sids[0] not in self.requests:
            raise UserError(f"no request {request_id!r} in this engine (released, aborted, or never added).")
        reqs = [self.requests[sid] for sid in sids]
        comps = [completion(k, req, self.decoder(req.params)) for k, req in enumerate(reqs)]
        done = all(req.status == RequestStatus.FINISHED for req in reqs)
        prompt = self._decode(reqs[0].prompt_ids) if self.tokenizer is not None else None
        return RequestOutput(request_id, prompt, list(reqs[0].prompt_ids), prompt_logprobs(reqs[0], self.decoder(
            reqs[0].params)), comps, done, metrics=request_metrics(reqs), num_cached_tokens=reqs[0].num_cached_tokens,
            num_preemptions=sum(req.num_preemptions for req in reqs))
