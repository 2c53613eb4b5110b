"""How the workers end: stopped (``shutdown``, at close and exit), or seen dying (``watch``, on GPUs).

On a CPU a dead worker breaks gloo's sockets, and rank 0's next collective raises within seconds
(group.py's ``failure`` names the rank). On GPUs a dead worker breaks nothing rank 0's host can see:
its GPU waits inside a replayed graph's collectives, which NCCL's watchdog never watches (captured
work is not handed to it), and in our all-reduce's polls; the host waits on the GPU, in the
sampler. So a thread waits on the workers' sentinels (a process's exit, seen by the OS):

    a worker exits, the engine not closing   one line on stderr, naming the rank and how it ended
                                             our all-reduce's waits stopped (allreduce.py: stop())
                                             NCCL's communicators aborted: their kernels return
                                             the group marked failed: the next step raises that line
    the engine closing (close, exit)         nothing: the workers were asked to go

What this does not do: the step in flight ends with whatever the aborted collectives left, and its
tokens reach their requests before the next step raises (no part of this stage sits between the
sampler and the requests). The line on stderr comes first, and every later step is refused. On
two H200s (tests/test_l12_gpu.py) a worker killed mid-replay stopped the engine 0.7 s and one step
later with that line.
"""
from __future__ import annotations

import multiprocessing.connection as mpc
import sys
import threading
import time

STOP_TIMEOUT_S = 5.0          # close(): how long workers get to leave before they are terminated


def watch(procs, held: dict, describe) -> threading.Thread:
    """Start the watch: ``held`` is the group's shared state (closing, failed, why, peer, pg),
    ``describe(proc)`` the one line for a worker that exited."""
    def run():
        ready = mpc.wait([p.sentinel for p in procs])
        if held["closing"]:
            return
        dead = next(p for p in procs if p.sentinel in ready)
        dead.join(1.0)                               # reaped: its exit code is known
        if held["closing"] or held["failed"]:        # a step's error named it first and stopped the rest
            return
        held["why"] = describe(dead)
        held["failed"] = True
        print(f"l12_tensor_parallel: {held['why']}", file=sys.stderr, flush=True)
        if held["peer"] is not None:
            held["peer"].stop()
        _abort(held["pg"])
    t = threading.Thread(target=run, name="tp-watch", daemon=True)
    t.start()
    return t


def how(p) -> str:
    code = p.exitcode
    for _ in range(50):                # None also while another thread's wait, which reaped it, records its code
        if code is not None or not mpc.wait([p.sentinel], timeout=0):
            break
        time.sleep(0.01)
        code = p.exitcode
    if code is None:
        return "exited" if mpc.wait([p.sentinel], timeout=0) else "is running"
    return f"was killed by signal {-code}" if code < 0 else f"exited ({code})"


def shutdown(procs, conns, held) -> None:
    """Stop every worker: a stop message, a bounded wait, then terminate and kill. Never hangs. Then
    this rank's CUDA graphs are destroyed and its NCCL communicators aborted, in that order: a live
    graph that captured a collective holds its communicator, and an abort waits for it (the probe's
    hang in destroy_process_group; a minute per engine, then NCCL gives up)."""
    held["closing"] = True                           # the watch lets the workers go now
    for c in conns:
        try:
            c.send_bytes(b"")
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for sig in ("terminate", "kill"):
        for p in procs:
            if p.is_alive():
                getattr(p, sig)()
                p.join(1.0)
    for c in conns:
        c.close()
    for graphs in held["graphs"]:                   # {key: (CUDAGraph, its static outputs...)}
        for entry in graphs.values():
            entry[0].reset()
        graphs.clear()                               # (a later step finds no graph: eager, and told it is closed)
    if held["peer"] is not None and not held["failed"]:   # our all-reduce's buffers, freed after a sync; after a
        held["peer"].close()                              # failure the GPU may wait on a dead peer: left to exit
    pg, held["pg"] = held["pg"], None
    if held["backend"] == "nccl":
        _abort(pg)


def _abort(pg) -> None:
    """NCCL: drop the communicators now, without waiting on peers (a group torn down already: nothing)."""
    abort = getattr(pg, "abort", None)
    if abort is not None:
        try:
            abort()
        except Exception:                            # noqa: BLE001
            pass
