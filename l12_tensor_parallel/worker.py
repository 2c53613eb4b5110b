"""A worker: one tensor-parallel rank other than 0. It holds a shard and a KV cache for its heads, and
runs the forward passes rank 0 sends it, nothing else (group.py draws the two sides).

    start   ignore Ctrl-C (rank 0 stops every rank), load this rank's slices of the checkpoint,
            build the KV cache and ops with the same assembler parts as rank 0, and its sizes (the
            ones rank 0's assembler was given, or made alike from the same options), say
            "ready", join the process group, install the collectives
    loop    read a step from the pipe -> the forward pass (its all-reduces and gather meet rank
            0's); an empty message: stop; EOF (rank 0 is gone): stop
    error   send the error's first line to rank 0, exit 1 (rank 0 names it in its one line)
"""
from __future__ import annotations

import os
import signal


def _line(e: BaseException) -> str:
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def device_of(spec, rank: int) -> str:
    """A rank's device: its own GPU (cuda:rank; untested until the GPU work), or the CPU."""
    return f"cuda:{rank}" if spec.device.startswith("cuda") else spec.device


def _build(rank: int, tp: int, spec):
    """This rank's model, KV cache and ops: the same parts rank 0's runner uses, for its shard."""
    import plumbing.runtime  # noqa: F401  (before any kernel: the interpreter on a CPU)
    from importlib import import_module

    from l5_scheduler.assemble import Assembly, resolve_options

    from .shard import load_shard
    model = load_shard(spec.path, device_of(spec, rank), spec.dtype, rank, tp)
    every = import_module(f"{spec.stages[-1]}.stage").STAGES
    stages = tuple(s for s in every if s.name in spec.stages)
    args = resolve_options(stages, spec.given)
    args.impl = spec.impl
    a = Assembly(model, None, spec.config, args, stages)
    return model, a.pool(), a.part("ops")


def main(rank: int, tp: int, port: int, conn, spec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import datetime

        import torch.distributed as dist

        from .comm import Comm, process_group
        from .layers import install
        model, cache, ops = _build(rank, tp, spec)
        store = dist.TCPStore("127.0.0.1", port, tp, is_master=False,
                              timeout=datetime.timedelta(seconds=spec.timeout_s))
        conn.send(("ready", None))
        pg = process_group(spec.backend, store, rank, tp, spec.timeout_s)
        install(model, Comm(pg, rank, tp))
    except BaseException as e:                       # noqa: BLE001  (told to rank 0, which raises it)
        _tell(conn, e)
    serve(conn, model, cache, ops, device_of(spec, rank))


def serve(conn, model, cache, ops, device) -> None:
    from .comm import unpack
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):                  # rank 0 is gone
            os._exit(0)
        if not msg:
            return                                   # close(): a clean stop
        try:
            input_ids, meta, default_ops = unpack(msg, device)
            model(input_ids, cache, meta, ops=None if default_ops else ops)
        except BaseException as e:                   # noqa: BLE001
            _tell(conn, e)


def _tell(conn, e: BaseException) -> None:
    try:
        conn.send(("error", _line(e)))
    except (OSError, ValueError):
        pass
    os._exit(1)
