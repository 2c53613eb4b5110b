"""Rank 0's side of tensor parallelism: the other ranks started, each step's inputs sent, failures named.

The engine core (scheduler, KV manager, sampler, stop checks) runs once, in this process, which is
rank 0. Ranks 1..tp-1 are worker processes (worker.py) that each hold a shard of the model and a KV
cache for its heads, and do nothing but forward passes:

    rank 0                                             rank r (worker.py)
    runner.execute(out) -> model(ids, cache, meta)     waits on its pipe
      ShardedModel (model.py): step(ids, meta)
      pack(ids, meta): structure -> each pipe  ------>  reads it
      flatten(tensors) ---------- broadcast ---------> unpack -> model(ids, its cache, meta)
      forward, shard 0     <--- all-reduces --->       forward, shard r
      lm_head: gather  <-----------------------------  its vocabulary's logits
    logits [S, V] -> sampler, stop checks

``step`` is what rank 0's model (model.py's ``ShardedModel``, the ``model`` part) does before its
shard runs: it sends the inputs, and turns any failure inside the forward pass into one line.
The block tables are identical on every rank because they are sent. Start (``context``): on a
CPU, forked from a forkserver that has imported the engine once (a worker starts in a fraction of
a second, and a plain fork of this process, which may hold an earlier engine's gloo threads, can
deadlock in the child); spawn where CUDA is used. A worker that dies, hangs or raises stops the
engine with one line (``RankFailed``): on a CPU its collectives fail; on GPUs a thread watches the
workers (lifecycle.py); ``close`` (also at exit, and after a failure) stops every worker.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.connection as mpc
import pickle
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from plumbing.errors import UserError

from .comm import Comm, Sent, flatten, pack, peer_all_reduce, process_group
from .lifecycle import how, shutdown, watch

START_TIMEOUT_S = 600.0       # a worker loads its shard and builds its cache within this
DEATH_WAIT_S = 5.0            # after a collective fails: how long a dying worker gets to be seen dead


class RankFailed(RuntimeError):
    """A tensor-parallel rank died, hung or raised: the engine cannot step any more."""


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its rank of the engine: the same checkpoint, sizes and options."""
    path: str
    device: str
    dtype: torch.dtype
    config: object                  # the EngineConfig given to rank 0's assembler, or None: made alike
    given: dict                     # the options given, less this stage's
    impl: str
    stages: tuple                   # the stage packages whose parts it builds (this one's excluded)
    backend: str
    timeout_s: float
    custom_all_reduce: bool = True  # our all-reduce for small messages (comm.py), NCCL's otherwise


PRELOAD = ["plumbing.runtime", "l12_tensor_parallel.stage", "l12_tensor_parallel.worker"]


def context(device: str):
    """How workers start: spawn with CUDA (a fork must not inherit a CUDA context); on a CPU a
    forkserver, started once per process with the engine's modules imported (PRELOAD)."""
    if device.startswith("cuda"):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)              # (ignored once the server runs: it has them)
    return ctx


class TensorParallel:
    """Ranks 1..tp-1 started and joined with this process (rank 0) in one group (``comm``)."""

    def __init__(self, spec: WorkerSpec, tp: int):
        if mp.current_process().daemon:
            raise UserError(f"tensor_parallel_size {tp} starts {tp - 1} worker processes, and this process is a "
                            "daemonic one (a server's engine core?), which Python forbids to have children: build the "
                            "engine in a non-daemonic process.")
        self.spec, self.tp = spec, tp
        self.closed, self.failed = False, None
        self.sent = Sent()                           # what sending the steps cost this host (for people)
        self.captured = 0                            # forward passes captured in CUDA graphs (graphs.py)
        store = dist.TCPStore("127.0.0.1", 0, tp, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=START_TIMEOUT_S))
        ctx = context(spec.device)
        self.procs, self.conns = [], []
        from .worker import main
        for rank in range(1, tp):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=main, args=(rank, tp, store.port, theirs, spec), name=f"tp-rank-{rank}",
                            daemon=True)
            p.start()
            theirs.close()
            self.procs.append(p)
            self.conns.append(mine)
        self._held = dict(graphs=[], peer=None, pg=None, backend=spec.backend, failed=False, closing=False, why=None)
        self._finalizer = weakref.finalize(self, shutdown, self.procs, self.conns, self._held)
        try:
            self._wait_ready()
            self.pg = process_group(spec.backend, store, 0, tp, spec.timeout_s)
            self._held["pg"] = self.pg
            self._held["peer"] = peer = peer_all_reduce(spec, store, self.pg, 0, tp)   # as each worker does
        except BaseException:                        # (the started ones wait for rank 0 in the group's set-up)
            self.stop_now()
            raise
        self.store, self.comm = store, Comm(self.pg, 0, tp, peer)
        if spec.backend == "nccl":                   # a GPU waiting on a dead rank: seen by a thread (lifecycle.py)
            procs = self.procs                       # (not self: the watch thread would keep the group alive)
            watch(procs, self._held, lambda p: f"tensor-parallel rank {procs.index(p) + 1} (pid {p.pid}) "
                                               f"{how(p)}; the engine stops.")

    def _wait_ready(self) -> None:
        """Every worker says "ready" (or its error, raised here in one line); a death is seen at once."""
        waiting, self.sizes = dict(zip(self.conns, range(1, self.tp))), {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiting:
            sentinels = {self.procs[r - 1].sentinel: r for r in waiting.values()}
            ready = mpc.wait(list(waiting) + list(sentinels), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RankFailed(f"tensor-parallel ranks {sorted(waiting.values())} did not start within "
                                 f"{START_TIMEOUT_S:.0f} s.")
            for c in ready:
                r = waiting.get(c) or sentinels[c]
                try:
                    kind, line = c.recv() if c in waiting else ("died", None)
                except EOFError:
                    kind, line = "died", None
                if kind == "error":
                    raise UserError(f"tensor-parallel rank {r}: {line}")
                if kind == "died":
                    p = self.procs[r - 1]
                    p.join(1.0)
                    raise RankFailed(f"tensor-parallel rank {r} (pid {p.pid}) {how(p)} while starting (its error "
                                     "is above; a script that builds the engine when imported must do it under "
                                     "`if __name__ == '__main__':`, since each rank imports the main module).")
                self.sizes[r] = line                 # the EngineConfig its GPU could hold
                waiting.pop(c, None)

    def agree(self, mine):
        """The sizes every rank builds its pool for: the smallest pool any rank's memory holds (a
        block id is a slot on every rank), sent to the workers, which build their caches now."""
        agreed = min([mine, *self.sizes.values()], key=lambda c: c.num_blocks)
        msg = pickle.dumps(agreed)
        for c in self.conns:
            c.send_bytes(msg)
        return agreed

    # ---- each step --------------------------------------------------------------------------------
    @contextmanager
    def step(self, input_ids, meta, default_ops: bool):
        """Around rank 0's forward pass: its inputs sent to every worker first (the structure by the
        pipes, the tensors by a broadcast: comm.py); an error inside it (a worker's, or this rank's
        own) raised as ``failure`` says. Inside a CUDA graph's capture the workers capture theirs."""
        self._check_open()
        try:
            t0, c0 = time.perf_counter(), time.thread_time()
            head, tensors, nbytes = pack(input_ids, meta, default_ops)
            capturing = input_ids.is_cuda and torch.cuda.is_current_stream_capturing()
            self.captured += capturing
            msg = pickle.dumps(("forward", capturing, nbytes, head), protocol=pickle.HIGHEST_PROTOCOL)
            for c in self.conns:
                c.send_bytes(msg)
            self.comm.broadcast(flatten(tensors, nbytes, input_ids.device))
            self.sent.add(time.thread_time() - c0, time.perf_counter() - t0, len(msg), nbytes)
            yield
        except Exception as e:
            err = self.failure(e)
            if err is e:
                raise
            raise err from None

    def _check_open(self) -> None:
        if self._held["why"] and not self.failed:       # the watch saw a worker exit (lifecycle.py)
            self.failed = self._held["why"]
            self.stop_now()
        if self.closed:
            raise RankFailed(self.failed or "the tensor-parallel ranks were shut down (close()): build a new engine.")

    def replay(self, index: int) -> None:
        """Before rank 0 replays the CUDA graph of its ``index``-th capture: each worker replays its own
        (the graph broadcasts the step's inputs and runs the forward pass on every rank)."""
        self._check_open()
        c0 = time.thread_time()
        msg = pickle.dumps(("replay", index))
        try:
            for c in self.conns:
                c.send_bytes(msg)
        except Exception as e:                       # a worker gone: named in one line, as in a step
            err = self.failure(e)
            if err is e:
                raise
            raise err from None
        self.sent.add_replay(time.thread_time() - c0)

    def failure(self, e: Exception) -> Exception:
        """The error to raise for ``e``: a ``RankFailed`` naming the rank when a worker died, hung or
        raised; ``e`` itself when it is this rank's own (a bug here). Either way every worker is
        stopped: the ranks are no longer in the same step."""
        text = str(e).lower()
        timed_out = "timed out" in text or "timeout" in text
        collective = isinstance(e, (OSError, EOFError)) or "gloo" in text or "nccl" in text
        if collective:                               # a peer is gone or going: its death is seen within seconds
            ready = mpc.wait([p.sentinel for p in self.procs], timeout=0.2 if timed_out else DEATH_WAIT_S)
            for p in self.procs:                     # a closed sentinel comes just before waitpid can reap
                if p.sentinel in ready:
                    p.join(1.0)
        lines = {}
        for r, c in enumerate(self.conns, 1):
            try:
                while c.poll():
                    kind, line = c.recv()
                    lines[r] = line
            except (OSError, EOFError):
                pass
        dead = [(r, p) for r, p in enumerate(self.procs, 1) if p.exitcode is not None]
        if dead:
            r, p = dead[0]
            msg = f"tensor-parallel rank {r} (pid {p.pid}) {how(p)}{': ' + lines[r] if r in lines else ''}; " \
                  "the engine stops."
        elif timed_out:
            msg = (f"a tensor-parallel collective waited {self.spec.timeout_s:.0f} s for a rank that did not answer "
                   "(a hung worker); the engine stops.")
        elif collective or lines:
            first = str(e).splitlines()[0][:160] if str(e) else ""
            said = "".join(f"; rank {r}: {x}" for r, x in lines.items())
            msg = f"tensor-parallel ranks failed ({type(e).__name__}: {first}){said}; the engine stops."
        else:                                        # this rank's own error: the workers wait inside the step
            self.failed = (f"an earlier step raised {type(e).__name__} on rank 0, which left the other ranks inside "
                           "it: build a new engine.")
            self.stop_now()
            return e
        self.failed = msg
        self.stop_now()
        return RankFailed(msg)

    def stop_now(self) -> None:
        """After a failure: the workers may wait inside the step, deaf to a stop message: terminate them."""
        self._held["failed"] = True
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        self.close()

    def close(self) -> None:
        """Stop the workers (idempotent; also at exit and after a failure)."""
        if not self.closed:
            self.closed = True
            self._finalizer()
            self.pg = None

    def hold_graphs(self, graphs: dict) -> None:
        """CUDA graphs that captured this group's collectives ({key: (graph, ...)}): destroyed before
        the communicators are aborted, at close() or exit."""
        self._held["graphs"].append(graphs)
