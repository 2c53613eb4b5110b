"""A worker: one tensor-parallel rank other than 0. It holds a shard and a KV cache for its heads, and
runs the forward passes rank 0 sends it, nothing else (group.py draws the two sides).

    start   ignore Ctrl-C (rank 0 stops every rank), take its GPU (cuda:rank), load this rank's
            slices of the checkpoint, size a pool for them (the sizes rank 0's assembler was
            given, or made alike from the same options and this GPU's free memory), say "ready"
            with those sizes, join the process group, install the collectives; then read the
            sizes every rank agreed on (rank 0's choice: the smallest pool, stage.py) and build
            the KV cache and ops with the same assembler parts as rank 0, for that pool
    loop    read a step's structure from the pipe, its tensors from rank 0's broadcast -> the
            forward pass (its all-reduces and gather meet rank 0's); captured as a CUDA graph when
            rank 0 captures its pass; "replay i": the graph of the i-th capture, as rank 0 replays
            its own (graphs.py); an empty message: stop; EOF (rank 0 is gone): stop
    error   send the error's first line to rank 0, exit 1 (rank 0 names it in its one line)
"""
from __future__ import annotations

import os
import pickle
import signal


def _line(e: BaseException) -> str:
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def device_of(spec, rank: int) -> str:
    """A rank's device: its own GPU (cuda:rank; untested until the GPU work), or the CPU."""
    return f"cuda:{rank}" if spec.device.startswith("cuda") else spec.device


def _assembly(rank: int, tp: int, spec, config):
    """This rank's shard and an Assembly of the same parts rank 0's runner uses, for it."""
    import plumbing.runtime  # noqa: F401  (before any kernel: the interpreter on a CPU)
    from importlib import import_module

    from l5_scheduler.assemble import Assembly, resolve_options

    from .shard import load_shard
    model = load_shard(spec.path, device_of(spec, rank), spec.dtype, rank, tp)
    every = import_module(f"{spec.stages[-1]}.stage").STAGES
    stages = tuple(s for s in every if s.name in spec.stages)
    args = resolve_options(stages, spec.given)
    args.impl = spec.impl
    return model, Assembly(model, None, config, args, stages)


def main(rank: int, tp: int, port: int, conn, spec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import datetime

        import torch
        import torch.distributed as dist

        from l5_scheduler.assemble import Assembly

        from .comm import Comm, peer_all_reduce, process_group
        from .group import START_TIMEOUT_S
        from .layers import install
        if spec.device.startswith("cuda"):
            torch.cuda.set_device(rank)              # before NCCL: its communicator is on this GPU
        model, a = _assembly(rank, tp, spec, spec.config)
        store = dist.TCPStore("127.0.0.1", port, tp, is_master=False,      # the start's bound: our all-reduce's
                              timeout=datetime.timedelta(seconds=START_TIMEOUT_S))  # exchange waits for every load
        conn.send(("ready", a.config))               # the pool this GPU could hold
        pg = process_group(spec.backend, store, rank, tp, spec.timeout_s)
        comm = Comm(pg, rank, tp, peer_all_reduce(spec, store, pg, rank, tp))
        install(model, comm)
        msg = conn.recv_bytes()                      # every rank's pool the same size: the block tables are shared
        if not msg:
            os._exit(0)                              # close() before the engine was built
        agreed = pickle.loads(msg)
        a = Assembly(model, None, agreed, a.args, a.stages)
        cache, ops = a.pool(), a.part("ops")
    except BaseException as e:                       # noqa: BLE001  (told to rank 0, which raises it)
        _tell(conn, e)
    serve(conn, model, cache, ops, comm, device_of(spec, rank))
    os._exit(0)                                      # no teardown of the group: NCCL's can wait on a peer gone


def serve(conn, model, cache, ops, comm, device) -> None:
    """Rank 0's forward passes, one message each: run it (and capture it, when rank 0 does, as the
    next CUDA graph), or replay the graph of rank 0's ``index``-th capture."""
    import torch

    from .comm import unpack
    graphs, pool = [], None
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):                  # rank 0 is gone
            os._exit(0)
        if not msg:                                  # close(): a clean stop, this GPU's queued work done first
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            return
        try:
            kind, *rest = pickle.loads(msg)
            if kind == "replay":
                graphs[rest[0]].replay()
                continue
            capturing, nbytes, head = rest

            def forward():
                flat = comm.broadcast(torch.empty(nbytes, dtype=torch.uint8, device=device))
                input_ids, meta, default_ops = unpack(head, flat)
                model(input_ids, cache, meta, ops=None if default_ops else ops)
            if not capturing:
                forward()
                continue
            graph = torch.cuda.CUDAGraph()           # rank 0 captures this pass: so does every rank
            with torch.cuda.graph(graph, pool=pool):
                forward()
            graphs.append(graph)
            pool = graphs[0].pool()                  # one memory pool, as rank 0's graphs share one
        except BaseException as e:                   # noqa: BLE001
            _tell(conn, e)


def _tell(conn, e: BaseException) -> None:
    """The error's line to rank 0, which raises it; its traceback to this rank's stderr, for whoever debugs."""
    import sys
    import traceback
    print(f"tensor-parallel worker (pid {os.getpid()}) failed:\n{''.join(traceback.format_exception(e))}",
          file=sys.stderr, flush=True)
    try:
        conn.send(("error", _line(e)))
    except (OSError, ValueError):
        pass
    os._exit(1)
