"""``AsyncLLM``: the server's handle on the engine core (vLLM's AsyncLLM), an asyncio front over the
engine loop that runs in its own process (engine_core.py).

    event loop (uvicorn + FastAPI)                 reader thread               engine core process
    ------------------------------                 -------------               -------------------
    sub = llm.submit(prompts, params, id)   ------------- pipe ------------->  make_requests, add_group
    await sub.accepted()    (400 or go on)  <-- call_soon_threadsafe --  recv  prompt ids, or the UserError
    async for i, up in sub.updates():       <-- one batch a step ------  recv  step(): new token ids
        detokenize (submission.py), send
    client gone: the generator closes       ------------- pipe ------------->  abort_request: blocks freed

The event loop never blocks: the reader thread waits on the pipe and hands each batch over in one
call. Pipes, process and reader thread are the engine client's (client.py): one engine core here,
or a later stage's several, behind the same ``send`` and ``_on_message``. Prompts are encoded and
stop strings checked in the engine core, with its tokenizer; the server detokenizes streams with
its own (a fast tokenizer must not be shared between threads:
"RuntimeError: Already borrowed").
"""
from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from l1_dense.checkpoint import load_tokenizer
from l4_sampler.params import SamplingParams
from plumbing.errors import UserError

from .client import engine_client
from .metrics import Metrics
from .submission import Submission


class QueueFull(Exception):
    """More requests in flight than ``max_pending``: the server answers 429."""


class EngineDead(RuntimeError):
    """The engine core raised or exited: every request in flight fails (503), /health says 503, and the
    server exits (serve.py) so that its supervisor starts a fresh one (vLLM's EngineDeadError)."""


class AsyncLLM:
    def __init__(self, model: str | None, llm_kwargs: dict, max_pending: int = 1024, served_name: str | None = None):
        """Start the engine core and wait until its model is loaded (a UserError if it cannot be).
        ``served_name``: the model's name in the API and in /metrics' ``model_name`` label."""
        self.client = engine_client(model, llm_kwargs)    # one engine core, or a later stage's several
        info = self.client.info
        self.proc = self.client.procs[0]
        self.info, self.snapshots, self.max_pending = info, info["snapshots"], max_pending
        self.front_tokenizer = load_tokenizer(Path(info["tokenizer_path"]))
        self.pending = 0                                  # sequences (prompts x n) submitted, not yet finished
        self.subs: dict[int, Submission] = {}
        self._keys = itertools.count()
        self.dead: str | None = None
        self.on_dead = None                               # called (on the event loop) once the core is gone
        self.stopping = False
        self.metrics = Metrics(served_name or model or "tiny-qwen3", info["max_model_len"],
                               lambda: (self.snapshots, self.pending))

    @property
    def snapshot(self) -> dict:
        """Engine core 0's latest snapshot (``snapshots``: every core's, by engine index)."""
        return self.snapshots[0]

    # ---- event loop side --------------------------------------------------------------------
    def start(self) -> None:
        self.client.start(asyncio.get_running_loop(), self._on_message)

    def send(self, msg) -> None:
        """An "add", "abort" or "stop" for the engine core(s): the client knows which core takes it."""
        self.client.send(msg)

    def submit(self, prompts: list, params: SamplingParams, request_id: str) -> Submission:
        """Hand prompts to the engine core (``max_tokens=None``: the room each prompt leaves, the
        engine's rule and the chat API's default)."""
        if self.dead is not None or self.stopping:
            raise EngineDead(self.dead or "the server is shutting down")
        seqs = len(prompts) * params.n
        if seqs > self.max_pending:                       # could never be taken: a 400, not a 429
            raise UserError(f"{len(prompts)} prompt(s) x n = {params.n} is {seqs} sequences, more than this server "
                            f"holds in flight (--max-pending {self.max_pending}): lower n or send fewer prompts.")
        if self.pending + seqs > self.max_pending:
            raise QueueFull(f"{self.pending} sequences are in flight and the limit is {self.max_pending} "
                            "(--max-pending): retry later")
        key = next(self._keys)                            # an int: it crosses the pipe every step
        sub = self.subs[key] = Submission(self, key, request_id, len(prompts), params)
        self.pending += seqs
        for i, prompt in enumerate(prompts):
            self.send(("add", key, i, sub.ids[i], prompt, params))
        return sub

    def forget(self, sub: Submission) -> None:
        """A submission closed: count it out, abort what it left unfinished."""
        self.subs.pop(sub.key, None)
        self.pending -= sub.n_prompts * sub.params.n
        for i in sorted(sub.left):
            self.send(("abort", sub.ids[i]))

    def shutdown(self, wait: bool = True) -> None:
        """Abort everything in flight (each stream ends with finish_reason "abort"), stop the core;
        from now on ``submit`` refuses (503)."""
        if not self.stopping:
            self.stopping = True
            self.send(("stop",))
        if wait:
            self.client.join(timeout=30)

    # ---- from the engine core(s), on the event loop (the client's reader threads hand it over) ----
    def _on_message(self, msg, engine: int = 0) -> None:
        if msg[0] in ("dead", "exited"):                 # raised, or gone (killed, crashed, or stopped)
            if msg[0] == "exited" and self.stopping:      # a stop we asked for: nothing failed
                return
            self.dead = msg[1]
            for sub in list(self.subs.values()):          # each waiting or streaming client, answered now
                sub.put("dead", 0, EngineDead(msg[1]))
            if self.on_dead is not None:
                self.on_dead(msg[1])
            return
        (keys, idx, toks), batch, self.snapshots[engine] = msg
        subs = self.subs
        for key, i, tok in zip(keys, idx, toks):                # the common case: one token, one choice
            sub = subs.get(key)
            if sub is not None:
                sub.put_token(i, tok)
        for key, kind, i, payload in batch:
            sub = subs.get(key)
            if sub is not None:
                sub.put(kind, i, payload)
