"""What the ranks say to each other: the collectives of a forward pass, and each step's inputs.

Two channels, for two kinds of waiting:

    collectives   all-reduce, gather          torch.distributed's process group (gloo on a CPU,
                                              NCCL on GPUs): every rank is inside the same forward
                                              pass, so each call is bounded by the group's timeout
    step inputs   rank 0 -> each worker       one pipe per worker: a worker waits for the next step
                                              as long as the engine is idle (a server may idle for
                                              hours, past any collective's timeout), and reads EOF,
                                              never a hang, when rank 0 is gone

A step's inputs are the forward pass's arguments as the runner made them: the input ids and the
metadata (positions, slots, block tables, the host ints the kernels choose by). They travel in two
parts, each by the channel that suits it:

    structure   ``pack``: a pickle of the arguments in which      the pipe (host bytes)
                each tensor is a place in one flat buffer
    tensors     ``flatten``: their bytes in that buffer, on the   a broadcast from rank 0 (device to
                device, copied there in stream order              device: no host copy, no sync)

So rank 0's host never waits for the GPU to send a step (the ids async scheduling fills in on the
device go as they are), and inside a CUDA graph the copies and the broadcast are captured with the
forward pass: a replay sends the step's inputs by itself (graphs.py).
"""
from __future__ import annotations

import datetime
import io
import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist


class Comm:
    """One rank's side of the collectives."""

    def __init__(self, pg, rank: int, size: int, peer=None):
        self.pg, self.rank, self.size, self.peer = pg, rank, size, peer       # peer: PeerAllReduce, or None
        self._gather = dist.GatherOptions()
        self._gather.rootRank = 0
        self._root = dist.BroadcastOptions()
        self._root.rootRank, self._root.rootTensor = 0, 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place; returns t. Ours (allreduce.py) where it takes t, else the group's."""
        if self.peer is not None:
            return self.peer(t)                      # (its fallback: the group's)
        self.pg.allreduce([t]).wait()
        return t

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's t into every rank's t (in place); returns t."""
        self.pg.broadcast([t], self._root).wait()
        return t

    def gather(self, t: torch.Tensor) -> torch.Tensor | None:
        """Every rank's t concatenated along the last dim, on rank 0 (None on the others)."""
        t = t.contiguous()
        if self.rank:
            self.pg.gather([], [t], self._gather).wait()
            return None
        out = [torch.empty_like(t) for _ in range(self.size)]
        self.pg.gather([out], [t], self._gather).wait()
        return torch.cat(out, dim=-1)


@dataclass
class Sent:
    """What sending the steps cost rank 0, for the forward passes it sent (pack, pipe writes, the
    broadcast's launch) and apart for the CUDA-graph replays it announced (a few bytes by pipe: the
    graph sends its own inputs): CPU time, wall time (with any wait for a core: a woken worker may
    take this one's), bytes by pipe and by broadcast."""
    steps: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    bytes: int = 0
    device_bytes: int = 0
    replays: int = 0
    replay_cpu_s: float = 0.0

    def add(self, cpu_s: float, wall_s: float, n: int, device_n: int) -> None:
        self.steps, self.bytes, self.device_bytes = self.steps + 1, self.bytes + n, self.device_bytes + device_n
        self.cpu_s, self.wall_s = self.cpu_s + cpu_s, self.wall_s + wall_s

    def add_replay(self, cpu_s: float) -> None:
        self.replays, self.replay_cpu_s = self.replays + 1, self.replay_cpu_s + cpu_s

    def __str__(self):
        per = self.steps or 1
        line = (f"{self.steps} steps sent: {self.cpu_s / per * 1e6:.0f} us of CPU ({self.wall_s / per * 1e6:.0f} us "
                f"wall), {self.bytes / per:.0f} bytes by pipe and {self.device_bytes / per:.0f} by broadcast a step")
        if self.replays:
            line += f"; {self.replays} replays announced: {self.replay_cpu_s / self.replays * 1e6:.0f} us of CPU each"
        return line


def peer_all_reduce(spec, store, pg, rank: int, size: int):
    """Our all-reduce for this rank (NCCL's groups only, unless disabled), built as every rank builds
    its own: each opens the others' buffers through the store. None: the group's all-reduce only."""
    if spec.backend != "nccl" or not spec.custom_all_reduce:
        return None
    from .allreduce import PeerAllReduce, store_exchange
    return PeerAllReduce(rank, size, store_exchange(store, rank, size), fallback=lambda t: pg.allreduce([t]).wait())


def process_group(backend: str, store, rank: int, size: int, timeout_s: float):
    """A process group of its own (not torch's global default: several engines may live in one process)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, size, opts)


ALIGN = 16                    # bytes: each tensor of a step starts on a 16-byte boundary of the flat buffer


def _up(o: int) -> int:
    return -(-o // ALIGN) * ALIGN


class _Packer(pickle.Pickler):
    """A pickle in which each tensor is its place in one flat byte buffer: (offset, dtype, shape)."""

    def __init__(self, f):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors, self.seen, self.nbytes = [], {}, 0

    def persistent_id(self, obj):
        if not isinstance(obj, torch.Tensor):
            return None
        key = id(obj)
        if key not in self.seen:
            self.seen[key] = (self.nbytes, str(obj.dtype)[6:], tuple(obj.shape))
            self.tensors.append(obj)
            self.nbytes = _up(self.nbytes + obj.numel() * obj.element_size())
        return self.seen[key]


def pack(*objs) -> tuple[bytes, list, int]:
    """One step's forward arguments (any picklable objects holding tensors) as their structure, a
    pickle a few hundred bytes long in which each tensor is a place in one flat byte buffer; the
    tensors, in that order; and the buffer's size."""
    f = io.BytesIO()
    p = _Packer(f)
    p.dump(objs)
    return f.getvalue(), p.tensors, p.nbytes


def flatten(tensors: list, nbytes: int, device) -> torch.Tensor:
    """The tensors' bytes at their places in one buffer, on ``device``: one copy launch each, no sync."""
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    o = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        if n:
            flat[o:o + n].copy_(t.reshape(-1).view(torch.uint8), non_blocking=True)
        o = _up(o + n)
    return flat


class _Unpacker(pickle.Unpickler):
    def __init__(self, f, flat: torch.Tensor):
        super().__init__(f)
        self.flat = flat

    def persistent_load(self, pid):
        o, dtype, shape = pid
        dtype = getattr(torch, dtype)
        n = dtype.itemsize
        for d in shape:
            n *= d
        return self.flat[o:o + n].view(dtype).view(shape)


def unpack(head: bytes, flat: torch.Tensor) -> tuple:
    """``pack``'s structure with its tensors as views of ``flat`` (the buffer ``flatten`` made, sent)."""
    return _Unpacker(io.BytesIO(head), flat).load()
