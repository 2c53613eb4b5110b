"""The engine client: the server's side of its engine core process(es) (vLLM's EngineCoreClient).

    AsyncLLM (async_llm.py)                 engine client                     engine core(s)
    -----------------------                 -------------                     --------------
    client.send(("add", key, i, id, ...))   which core: the only one  ---->   engine_core.py
    client.send(("abort", id))              (a later stage's client
    client.send(("stop",))                   routes among several)
    on_message(msg, engine)      <-- on the event loop --  reader thread(s)  <----  one message a step

Which client runs is the assembler's ``engine_client`` slot (l5_scheduler/assemble.py): the
latest stage whose maker makes one for these options (a later stage's: several engine cores, each
request sent to one), else this stage's ``CoreClient``, one engine core. Every client has:

    info         what the core(s) said when ready: describe, max_model_len, tokenizer_path,
                 snapshots (one per engine core, in its index order)
    procs        the engine core processes
    start(loop, on_message)   its reader thread(s): ``on_message(msg, engine)`` runs on ``loop``,
                 ``engine`` the index of the core that sent it (its /metrics label)
    send(msg)    "add" / "abort" / "stop" (engine_core.py's messages)
    join(timeout)             wait for the core(s) to exit; kill any that do not
"""
from __future__ import annotations

import atexit
import multiprocessing
import threading

from plumbing.errors import UserError

from .engine_core import run_engine_core


def _stop_at_exit(proc) -> None:
    """At the server's exit, whatever ended it: the engine core goes too (a bounded wait, then a kill)."""
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(1)


class CoreClient:
    """One engine core process, its two pipes and the thread that reads it. ``__init__`` starts it;
    ``ready()`` waits until its model is loaded (a UserError if it cannot be), so that several can
    load at once (a later stage's several cores)."""

    def __init__(self, model: str | None, llm_kwargs: dict, name: str = "engine-core"):
        ctx = multiprocessing.get_context("spawn")        # CUDA cannot be forked: a fresh interpreter
        to_core_r, to_core_w = ctx.Pipe(duplex=False)
        from_core_r, from_core_w = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=run_engine_core, args=(model, llm_kwargs, to_core_r, from_core_w),
                                name=name, daemon=False)  # its parts may start processes of their own,
        self.proc.start()                                 # which Python forbids a daemonic process
        atexit.register(_stop_at_exit, self.proc)         # so stopped here at exit (before multiprocessing joins it)
        to_core_r.close()                                 # the child's ends: with ours closed, each side
        from_core_w.close()                               # sees EOF when the other exits
        self._to_core, self._from_core = to_core_w, from_core_r
        self.procs, self.info = [self.proc], None

    def ready(self) -> "CoreClient":
        try:
            kind, info = self._from_core.recv()
        except EOFError:
            self.proc.join(5)
            raise UserError(f"the engine core exited while loading (exit code {self.proc.exitcode}): see above") from None
        if kind == "failed":
            self.proc.join()
            raise UserError(info)
        info["snapshots"] = [info.pop("snapshot")]
        self.info = info
        return self

    def start(self, loop, on_message, engine: int = 0) -> None:
        threading.Thread(target=self._read, args=(loop, on_message, engine), name=f"engine-core-reader-{engine}",
                         daemon=True).start()

    def send(self, msg) -> None:
        try:
            self._to_core.send(msg)
        except (BrokenPipeError, OSError):                # the core is gone: the reader reports it
            pass

    def join(self, timeout: float = 30) -> None:
        self.proc.join(timeout=timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(1)

    def _read(self, loop, on_message, engine: int) -> None:
        while True:
            try:
                msg = self._from_core.recv()
            except (EOFError, OSError):
                self.proc.join(timeout=1)                 # reaped: its exit code is known
                msg = ("exited", f"the engine core exited (exit code {self.proc.exitcode})")
            try:
                loop.call_soon_threadsafe(on_message, msg, engine)
            except RuntimeError:                          # the event loop is closed: the server is gone
                return
            if msg[0] in ("dead", "exited"):
                return


def one_core(a) -> CoreClient:
    """Stage 10's engine client, when no stage makes one: one engine core, loaded."""
    kw = dict(a.args.given)
    return CoreClient(kw.pop("model", None), kw).ready()


def engine_client(model: str | None, llm_kwargs: dict):
    """The engine client these options ask for (the ``engine_client`` slot, over every stage's
    options: one checked here is checked before any core starts)."""
    from l5_scheduler.assemble import Assembly, resolve_options
    from l5_scheduler.stages import latest
    stages = latest("stage").STAGES
    args = resolve_options(stages, dict(llm_kwargs, model=model))
    return Assembly(None, None, None, args, stages).part("engine_client", default=one_core)
