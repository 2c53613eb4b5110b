"""Data parallelism: ``data_parallel_size`` replicas of the whole engine behind one server, each
request routed to one of them (vLLM's DP load-balancing client).

    server process (stage 10)                                   replica r: an engine core process
    -------------------------                                   ---------------------------------
    AsyncLLM.send(("add", key, i, id, prompt, params))          CUDA_VISIBLE_DEVICES = its GPU(s)
      DataParallel.send: router.pick(prompt) -> r  ---------->  engine_core.py: LLM(...) of its own
    AsyncLLM.send(("abort", id))  -> the replica that took it   (tensor_parallel_size > 1: it starts
    AsyncLLM.send(("stop",))      -> every replica               its own TP workers, a TP group)
    AsyncLLM._on_message(msg, r)  <-- each replica's reader --  one message a step
      (a last update counts the request out of r's load)

Each replica is stage 10's ``CoreClient``, unchanged: this part only chooses which one a message
goes to, and counts what each has in flight (router.py). A small model's step is bound by the
host and by reading the weights once per step, not by the GPU's arithmetic: a second engine on a
second GPU doubles the steps per second, where tensor parallelism (lesson 12.4) adds all-reduces to
every step. Replicas share nothing, so their tokens are the single engine's.

On GPUs, replica r sees GPUs r*tp .. r*tp+tp-1 of those visible (as vLLM's data-parallel engines,
through CUDA_VISIBLE_DEVICES, so each calls its first GPU cuda:0). On a CPU each replica is a
process, with cpu_count / data_parallel_size torch threads unless OMP_NUM_THREADS is set.

A replica that dies (raises in a step, or exits) is stage 10's engine death: every request in
flight, on every replica, is answered 503 at once, and the server stops with one line naming the
replica (exit status 1: a supervisor starts a fresh one, the one state known good), as vLLM stops
all of its data-parallel engines when one dies.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from plumbing.errors import UserError

from .router import Router

MINE = ("data_parallel_size", "data_parallel_routing")      # the options a replica's own engine never sees


@contextlib.contextmanager
def environment(**values):
    """os.environ with ``values`` set (None: left as it is) while a replica's process starts (spawn
    copies the environment then)."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is not None:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def placement(device: str, dp: int, tp: int) -> list[str | None]:
    """Each replica's CUDA_VISIBLE_DEVICES (None on a CPU), checked against the GPUs visible here."""
    if not device.startswith("cuda"):
        return [None] * dp
    if device != "cuda":
        raise UserError(f"device {device!r} names one GPU and data_parallel_size {dp} gives each replica its own: "
                        "pass device=cuda (--device cuda); CUDA_VISIBLE_DEVICES chooses which GPUs.")
    import torch
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else \
        [str(i) for i in range(torch.cuda.device_count())]
    if dp * tp > len(ids):
        raise UserError(f"data_parallel_size {dp} x tensor_parallel_size {tp} needs {dp * tp} GPUs (one per rank of "
                        f"each replica) and {len(ids)} {'is' if len(ids) == 1 else 'are'} visible: lower "
                        "data_parallel_size, or make more visible (CUDA_VISIBLE_DEVICES).")
    return [",".join(ids[r * tp:(r + 1) * tp]) for r in range(dp)]


def start(args) -> "DataParallel":
    """The replicas these options ask for, started at once and loaded (one UserError naming the
    replica that could not load; the others are stopped)."""
    from l10_server.client import CoreClient
    from plumbing.runtime import default_device
    kw = {k: v for k, v in args.given.items() if k not in MINE}
    model = kw.pop("model", None)
    dp = args.data_parallel_size
    gpus = placement(args.device or default_device(), dp, args.tensor_parallel_size)
    threads = None if gpus[0] is not None or "OMP_NUM_THREADS" in os.environ else \
        str(max(1, (os.cpu_count() or 1) // dp))
    cores = []
    try:
        for r, visible in enumerate(gpus):
            with environment(CUDA_VISIBLE_DEVICES=visible, OMP_NUM_THREADS=threads):
                cores.append(CoreClient(model, kw, name=f"engine-core-{r}"))
        for r, core in enumerate(cores):
            try:
                core.ready()
            except UserError as e:
                raise UserError(f"data-parallel replica {r}: {e}") from None
    except BaseException:
        for core in cores:                       # those that loaded leave; the rest are killed
            core.send(("stop",))
        for core in cores:
            core.join(10)
        raise
    encode = None
    if args.data_parallel_routing == "prefix":   # text prompts: their first block's ids, as the cores encode
        from l1_dense.checkpoint import load_tokenizer
        encode = load_tokenizer(Path(cores[0].info["tokenizer_path"])).encode
    where = ", ".join(f"GPU {g}" for g in gpus) if gpus[0] is not None else f"{dp} CPU processes"
    return DataParallel(cores, Router(dp, args.data_parallel_routing, args.block_size, encode), where)


class DataParallel:
    """The ``engine_client`` part at data_parallel_size > 1: stage 10's client interface
    (l10_server/client.py) over engine cores that are ready (``start``), one router between them."""

    def __init__(self, cores: list, router: Router, where: str = ""):
        self.cores, self.router = cores, router
        self.procs = [c.proc for c in cores]
        infos = [c.info for c in cores]
        self.info = dict(infos[0], max_model_len=min(i["max_model_len"] for i in infos),
                         snapshots=[i["snapshots"][0] for i in infos],
                         describe=f"{infos[0]['describe']} | data_parallel_size {len(cores)} ({where}), "
                                  f"{router.how} routing")
        self.where: dict[tuple[int, int], tuple[int, str, int]] = {}   # (key, i) -> (replica, request id, seqs)
        self.replica_of: dict[str, int] = {}                            # request id -> replica
        self.down, self.on_message, self.stopping = None, None, False

    # ---- the engine client's interface (l10_server/client.py) --------------------------------------
    def start(self, loop, on_message) -> None:
        self.on_message = on_message
        for r, core in enumerate(self.cores):
            core.start(loop, self._from_core, r)

    def send(self, msg) -> None:
        op = msg[0]
        if op == "add":
            key, i, rid, prompt, params = msg[1:]
            r = self.router.pick(prompt)
            self.router.add(r, params.n)
            self.where[key, i], self.replica_of[rid] = (r, rid, params.n), r
            self.cores[r].send(msg)
        elif op == "abort":
            r = self.replica_of.get(msg[1])
            if r is not None:                     # else finished meanwhile: nothing to abort
                self.cores[r].send(msg)
        else:                                     # stop: every replica
            self.stopping = True
            for core in self.cores:
                core.send(msg)

    def join(self, timeout: float = 30) -> None:
        for core in self.cores:
            core.join(timeout)

    # ---- from replica r, on the event loop ----------------------------------------------------------
    def _from_core(self, msg, r: int) -> None:
        if self.down is not None:                 # a replica died: the server is answering and stopping
            return
        if msg[0] == "exited" and self.stopping:  # asked to stop: the others' last aborts may still come
            return
        if msg[0] in ("dead", "exited"):
            self.down = r
            self.on_message((msg[0], f"data-parallel replica {r} (pid {self.cores[r].proc.pid}): {msg[1]}"), r)
            return
        for key, kind, i, payload in msg[1]:
            if (kind == "ack" and isinstance(payload, BaseException)) or (kind == "out" and payload[1]):
                self._finished(key, i)            # refused, or its last choice finished (or was aborted)
        self.on_message(msg, r)

    def _finished(self, key: int, i: int) -> None:
        got = self.where.pop((key, i), None)
        if got is not None:
            r, rid, seqs = got
            self.replica_of.pop(rid, None)
            self.router.done(r, seqs)
