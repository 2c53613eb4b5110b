"""``AsyncLLM``: the one engine loop behind an asyncio server (vLLM's AsyncLLM, with a thread where
vLLM has a process).

    event loop (uvicorn + FastAPI)                      engine thread (owns engine and tokenizer)
    ------------------------------                      -----------------------------------------
    sub = llm.submit(prompts, params, id)   --inbox-->  make_requests, add_group
    await sub.accepted()    (400 or go on)  <--------   prompt ids, or the UserError
    async for i, up in sub.updates():       <--------   step(); detokenize; ONE hand-over per step
        send the chunk                                  (loop.call_soon_threadsafe)
    client gone: the generator closes       --inbox-->  abort_request: blocks free before the next step

Why a thread: ``step()`` blocks for the whole forward pass. On the event loop it would stall every
connection for that long, and a client that disconnects would not be noticed until it returned.
The engine thread steps while any request is in flight and sleeps on its inbox otherwise.

Why the engine thread also tokenizes: a Hugging Face fast tokenizer is not safe to share between
threads (it mutates its truncation/padding state, and a second thread gets "RuntimeError: Already
borrowed"). One thread owns the engine *and* the tokenizer; the event loop only renders chat
templates (Python) and moves bytes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import traceback
from dataclasses import dataclass

from l4_sampler.params import SamplingParams
from plumbing.errors import UserError

from .detok import IncrementalDetokenizer


@dataclass
class Choice:
    """One completion's progress in one step, as the server sends it."""
    index: int
    text: str                              # new text that may be sent now (may be "")
    token_ids: list[int]
    logprobs: list | None = None           # stage 4's TokenLogprobs of the new tokens, when asked for
    finish_reason: str | None = None       # "stop" | "length" | "abort" on the choice's last update
    stop_reason: int | str | None = None


@dataclass
class Update:
    choices: list[Choice]
    finished: bool                         # every choice of this prompt has finished


class QueueFull(Exception):
    """More requests in flight than ``max_pending``: the server answers 429."""


class EngineDead(RuntimeError):
    """``step()`` raised (a bug): every request in flight fails, /health says 503."""


class Submission:
    """The prompts of one HTTP request, seen from the event loop: one queue for all of them."""

    def __init__(self, owner: AsyncLLM, request_id: str, n_prompts: int):
        self.owner, self.request_id, self.n_prompts = owner, request_id, n_prompts
        self.ids = [request_id if n_prompts == 1 else f"{request_id}-{i}" for i in range(n_prompts)]
        self.queue: asyncio.Queue = asyncio.Queue()
        self.prompt_token_ids: list[list[int]] = [[] for _ in range(n_prompts)]
        self.left = set(range(n_prompts))          # prompts not finished yet
        self.closed = False

    async def accepted(self) -> None:
        """Wait until the engine thread took every prompt; a UserError (bad prompt, too long) is raised
        here, before any response is sent, and the prompts it did take are aborted."""
        for _ in range(self.n_prompts):
            i, item = await self.queue.get()
            if isinstance(item, BaseException):
                self.close()
                raise item
            self.prompt_token_ids[i] = item

    async def updates(self):
        """(prompt index, Update) until every prompt has finished. Leaving early (a client that went
        away cancels the task awaiting here) aborts what is left."""
        try:
            while self.left:
                i, item = await self.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    self.left.discard(i)
                yield i, item
        finally:
            self.close()

    def close(self) -> None:
        """Abort whatever has not finished; count the submission out (once)."""
        if self.closed:
            return
        self.closed = True
        self.owner.pending -= self.n_prompts
        for i in sorted(self.left):
            self.owner.inbox.put(("abort", self.ids[i]))


@dataclass
class _Track:
    """The engine thread's record of one prompt in flight."""
    sub: Submission
    i: int                                 # the prompt's index in its submission
    detoks: list[IncrementalDetokenizer]   # one per choice
    left: int                              # choices not finished
    logprobs: bool


class AsyncLLM:
    def __init__(self, llm, max_pending: int = 1024):
        if llm.tokenizer is None:
            raise UserError("this checkpoint has no tokenizer, and a server sends text: serve one that ships "
                            "tokenizer.json / tokenizer_config.json.")
        self.engine, self.tokenizer, self.max_pending = llm.llm_engine, llm.tokenizer, max_pending
        self.engine.keep_stats = False             # no per-step record: a server runs for days
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.pending = 0                           # prompts submitted and not yet finished (event loop)
        self.dead: BaseException | None = None
        self.stopping = False
        self._tracks: dict[str, _Track] = {}       # engine thread only, from here down
        self._seq: dict[str, tuple[_Track, int]] = {}    # sequence id -> (its prompt, its choice index)
        self.counts = {"prompt_tokens": 0, "generation_tokens": 0, "requests_finished": 0, "max_running": 0}
        self.snapshot = self._snapshot()
        self._thread: threading.Thread | None = None

    # ---- event loop side --------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def submit(self, prompts: list, params: SamplingParams, request_id: str, fill_max_tokens=False) -> Submission:
        """Hand prompts to the engine thread. ``fill_max_tokens``: max_tokens is whatever room the
        prompt leaves (the chat API's default)."""
        if self.dead is not None or self.stopping:
            raise EngineDead("the server is shutting down" if self.dead is None else
                             f"the engine stopped after an error: {self.dead!r}")
        if self.pending + len(prompts) > self.max_pending:
            raise QueueFull(f"{self.pending} prompts are in flight and the limit is {self.max_pending} "
                            "(--max-pending): retry later")
        sub = Submission(self, request_id, len(prompts))
        self.pending += len(prompts)
        for i, prompt in enumerate(prompts):
            self.inbox.put(("add", sub, i, prompt, params, fill_max_tokens))
        return sub

    def shutdown(self, wait: bool = True) -> None:
        """Abort everything in flight (each stream ends with finish_reason "abort"), stop the thread;
        from now on ``submit`` refuses (503)."""
        self.stopping = True
        if self._thread is not None and self._thread.is_alive():
            self.inbox.put(("stop",))
            if wait:
                self._thread.join(timeout=30)

    # ---- engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        eng = self.engine
        try:
            while self._drain(block=not eng.has_unfinished_requests()):
                if eng.has_unfinished_requests():
                    self._emit(eng.step())
                self.snapshot = self._snapshot()
        except BaseException as e:                 # a bug: fail every request in flight, stay up for /health
            traceback.print_exc()
            self.dead = e
            self._deliver([(t.sub, t.i, EngineDead(f"the engine stopped after an error: {e!r}"))
                           for t in self._tracks.values()])

    def _drain(self, block: bool) -> bool:
        """Take what the event loop sent (waiting for it when idle); False on "stop"."""
        items = [self.inbox.get()] if block else []
        while True:
            try:
                items.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        out = []
        for op, *args in items:
            if op == "add":
                out.append(self._add(*args))
            elif op == "abort":
                out.extend(self._abort(args[0]))
            else:                                  # stop: abort everything, and say so to each stream
                out.extend(x for rid in list(self._tracks) for x in self._abort(rid))
                self._deliver(out)
                return False
        self._deliver(out)
        return True

    def _add(self, sub: Submission, i: int, prompt, params: SamplingParams, fill: bool):
        eng, rid = self.engine, sub.ids[i]
        try:
            if fill:                               # the room this prompt leaves
                room = min(eng.config.max_model_len, eng.config.capacity) - len(eng.prompt_ids(prompt))
                params = dataclasses.replace(params, max_tokens=max(room, 1))
            rid, reqs = eng.make_requests(prompt, params, rid)
        except UserError as e:
            return sub, i, e
        eng.add_group(rid, reqs)
        detoks = [IncrementalDetokenizer(self.tokenizer, params.stop, params.include_stop_str_in_output)
                  for _ in reqs]
        track = self._tracks[rid] = _Track(sub, i, detoks, len(reqs), params.logprobs is not None)
        for k, req in enumerate(reqs):
            self._seq[req.request_id] = (track, k)
        self.counts["prompt_tokens"] += len(reqs[0].prompt_ids)
        return sub, i, list(reqs[0].prompt_ids)

    def _abort(self, rid: str) -> list:
        track = self._tracks.pop(rid, None)
        if track is None:                          # finished meanwhile, or refused: nothing to do
            return []
        self.engine.abort_request(rid)
        ids = [sid for sid, (t, _) in self._seq.items() if t is track]
        ends = [Choice(self._seq.pop(sid)[1], "", [], None, "abort") for sid in ids]
        self.counts["requests_finished"] += 1
        return [(track.sub, track.i, Update(ends, True))]

    def _emit(self, outs) -> None:
        """One step's outputs -> one Update per prompt that moved, handed over in one call."""
        eng, updates = self.engine, {}
        for o in outs:
            track, k = self._seq[o.request_id]
            req, detok = eng.requests[o.request_id], track.detoks[k]
            detok.add(o.new_token_ids)
            lps = req.logprobs[-len(o.new_token_ids):] if track.logprobs else None
            ch = Choice(k, "", list(o.new_token_ids), lps)
            if o.finished:
                rid = track.sub.ids[track.i]
                final = eng.output(rid).outputs[k]                 # the engine's text: cut at a stop string
                ch.text, ch.finish_reason, ch.stop_reason = detok.delta(final.text), final.finish_reason, final.stop_reason
                track.left -= 1
                del self._seq[o.request_id]
            else:
                ch.text = detok.delta()
            self.counts["generation_tokens"] += len(o.new_token_ids)
            updates.setdefault(id(track), (track, []))[1].append(ch)
        batch = []
        for track, chs in updates.values():
            if track.left == 0:                                    # the engine forgets it now
                rid = track.sub.ids[track.i]
                eng.release(rid)
                del self._tracks[rid]
                self.counts["requests_finished"] += 1
            batch.append((track.sub, track.i, Update(chs, track.left == 0)))
        self._deliver(batch)

    def _deliver(self, batch: list) -> None:
        if batch:
            try:
                self._loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:                   # the event loop is closed: the server is gone
                pass

    def _snapshot(self) -> dict:
        """What /metrics reports; written by the engine thread after each step, read whole."""
        sched = self.engine.scheduler
        kv = sched.kv
        self.counts["max_running"] = max(self.counts["max_running"], len(sched.running))
        stats = getattr(kv, "stats", None)         # a prefix cache's hit counters (stage 6 on)
        return dict(self.counts, running=len(sched.running), waiting=len(sched.waiting),
                    kv_blocks_total=kv.num_blocks, kv_blocks_free=kv.num_free,
                    prefix_cache_queries=stats.queries if stats else 0, prefix_cache_hits=stats.hits if stats else 0)


def _put_all(batch: list) -> None:
    for sub, i, item in batch:
        if not sub.closed:
            sub.queue.put_nowait((i, item))
