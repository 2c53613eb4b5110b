"""One HTTP request's prompts, seen from the event loop: what the engine core hands over, merged
until the response's writer takes it, then turned into text.

The engine core sends token ids only (a ``Choice``'s fields with no text). Two things happen here,
in the server, and not in the engine core, whose host time is every request's step time:

* **detokenization** (detok.py), with the server's own tokenizer;
* **merging** (vLLM's RequestOutputCollector does the same): while the writer has not taken the
  last update, a new one is folded into it. A writer that keeps up sends one chunk a token; one
  that falls behind (hundreds of streams at once) sends bigger chunks, so the cost of writing
  stops growing with the step rate and never slows the engine down.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from l5_scheduler.outputs import prompt_logprob_dicts
from l5_scheduler.request import decoder
from plumbing.errors import UserError

from .detok import IncrementalDetokenizer


@dataclass
class Choice:
    """One completion's progress: in one step (from the engine core) or since the last chunk."""
    index: int
    text: str                              # new text that may be sent now (may be "")
    token_ids: list[int]
    logprobs: list | None = None           # stage 4's TokenLogprobs of the new tokens, when asked for
    finish_reason: str | None = None       # "stop" | "length" | "abort" on the choice's last update
    stop_reason: int | str | None = None
    final_text: str | None = None          # the engine's whole text, when it finished ("stop"/"length")


@dataclass
class Update:
    choices: list[Choice]
    finished: bool                         # every choice of this prompt has finished
    prompt_logprobs: list | None = None    # once, with the prompt's first update, when asked: vLLM's
                                           # RequestOutput.prompt_logprobs (None, then {id: Logprob} a token)


class Submission:
    def __init__(self, owner, key: int, request_id: str, n_prompts: int, params):
        self.owner, self.key, self.request_id, self.n_prompts, self.params = owner, key, request_id, n_prompts, params
        self.ids = [request_id if n_prompts == 1 else f"{request_id}-{i}" for i in range(n_prompts)]
        self.acks: asyncio.Queue = asyncio.Queue()
        self.prompt_token_ids: list[list[int]] = [[] for _ in range(n_prompts)]
        self.left = set(range(n_prompts))          # prompts whose last update was not taken yet
        self.raw: dict[int, dict[int, Choice]] = {}    # prompt -> choice -> ids not taken yet
        self.finished_raw: set[int] = set()        # prompts whose last update has arrived
        self.detoks: dict[tuple[int, int], IncrementalDetokenizer] = {}
        self.prompt_lps: dict[int, list] = {}      # prompt -> its prompt logprobs, until its update takes them
        self.wake = asyncio.Event()
        self.error: BaseException | None = None
        self.closed = False
        self.timers = [owner.metrics.timer() for _ in range(n_prompts)]    # /metrics' latency histograms
        self.reasons: dict[int, str] = {}          # prompt -> its latest choice's finish_reason

    # ---- from the engine core (on the event loop: AsyncLLM._on_message) ---------------------
    def put_token(self, i: int, tok: int) -> None:
        """One new token of choice 0 (the common case, sent compactly)."""
        if self.closed:
            return
        self.timers[i].tokens_arrived(1)
        have = self.raw.setdefault(i, {})
        ch = have.get(0)
        if ch is None:
            have[0] = Choice(0, "", [tok])
        else:
            ch.token_ids.append(tok)                       # merge: the writer has not taken it yet
        self.wake.set()

    def put(self, kind: str, i: int, payload) -> None:
        if self.closed:
            return
        if kind == "ack":
            if isinstance(payload, list):          # the prompt's ids: the engine core took it
                self.timers[i].prompt_tokens = len(payload)
            self.acks.put_nowait((i, payload))
            return
        if kind == "prompt_logprobs":              # just before the prompt's first update (engine_core._emit)
            self.prompt_lps[i] = payload
            return
        if kind == "dead":                         # the engine core is gone: answer everything now
            self.error = payload
            for _ in range(self.n_prompts):        # acks that will never come (accepted() takes n_prompts)
                self.acks.put_nowait((None, payload))
        else:
            choices, finished, stats = payload
            have = self.raw.setdefault(i, {})
            self.timers[i].tokens_arrived(sum(len(c[1]) for c in choices))
            for k, ids, lps, reason, stop_reason, final_text in choices:
                ch = Choice(k, "", ids, lps, reason, stop_reason, final_text)
                if reason is not None:
                    self.reasons[i] = reason
                old = have.get(ch.index)
                if old is None:
                    have[ch.index] = ch
                    continue
                old.token_ids += ch.token_ids                # merge: the writer has not taken it yet
                if ch.logprobs is not None:
                    old.logprobs = (old.logprobs or []) + ch.logprobs
                old.finish_reason, old.stop_reason, old.final_text = ch.finish_reason, ch.stop_reason, ch.final_text
            if finished:
                self.finished_raw.add(i)
                self.timers[i].finished(self.reasons.get(i, "abort"), self.params.n, stats)
        self.wake.set()

    # ---- the response's writer -------------------------------------------------------------
    async def accepted(self) -> None:
        """Wait until the engine core took every prompt. A refusal (a UserError: bad prompt, too long;
        RequestFailed; EngineDead when the core died meanwhile) is raised here, before any response is
        sent, and the prompts it did take are aborted."""
        for _ in range(self.n_prompts):
            i, item = await self.acks.get()
            if isinstance(item, UserError) and self.n_prompts > 1:
                item = UserError(f"prompt {i}: {item}")   # which of the list (as LLM.generate says it)
            if isinstance(item, BaseException):
                self.close()
                raise item
            self.prompt_token_ids[i] = item

    async def updates(self):
        """(prompt index, Update) until every prompt has finished. Leaving early (a client that went
        away cancels the task awaiting here) aborts what is left."""
        try:
            while self.left:
                if self.error is not None:
                    raise self.error
                if not self.raw:
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                raw, self.raw = self.raw, {}
                for i in sorted(raw):
                    finished = i in self.finished_raw
                    if finished:
                        self.left.discard(i)
                    plps = self.prompt_lps.pop(i, None)
                    yield i, Update([self._text(i, raw[i][k]) for k in sorted(raw[i])], finished,
                                    None if plps is None else self._prompt_logprobs(plps))
        finally:
            self.close()

    def _text(self, i: int, ch: Choice) -> Choice:
        d = self.detoks.get((i, ch.index))
        if d is None:
            p = self.params
            d = self.detoks[i, ch.index] = IncrementalDetokenizer(self.owner.front_tokenizer, p.stop,
                                                                    p.include_stop_str_in_output,
                                                                    p.skip_special_tokens,
                                                                    p.spaces_between_special_tokens)
        d.add(ch.token_ids)
        ch.text = d.delta(ch.final_text) if ch.final_text is not None else d.delta()
        return ch

    def _prompt_logprobs(self, lps: list) -> list:
        """Stage 4's TokenLogprobs of the prompt -> vLLM's list, decoded here as the engine decodes it
        offline (l5_scheduler/outputs.py: the same function, the request's special-token options)."""
        p = self.params
        return prompt_logprob_dicts(lps, decoder(self.owner.front_tokenizer, p.skip_special_tokens,
                                                 p.spaces_between_special_tokens))

    def close(self) -> None:
        """Abort whatever has not finished; count the submission out (once)."""
        if self.closed:
            return
        self.closed = True
        for i in self.left - self.finished_raw:    # taken by the engine core, then aborted: "abort"
            if self.timers[i].prompt_tokens is not None and self.error is None:
                self.timers[i].finished("abort", self.params.n, None)
        self.owner.forget(self)
