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
metadata (positions, slots, block tables, the host ints the kernels choose by). ``pack`` writes them
as one message: a pickle of the metadata in which every tensor is a reference into a byte blob
that follows it, so the tensors cost one ``tobytes`` each and no per-tensor pickling.
"""
from __future__ import annotations

import datetime
import io
import pickle
import struct

import torch
import torch.distributed as dist


class Comm:
    """One rank's side of the collectives."""

    def __init__(self, pg, rank: int, size: int):
        self.pg, self.rank, self.size = pg, rank, size
        self._gather = dist.GatherOptions()
        self._gather.rootRank = 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place; returns t."""
        self.pg.allreduce([t]).wait()
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


def process_group(backend: str, store, rank: int, size: int, timeout_s: float):
    """A process group of its own (not torch's global default: several engines may live in one process)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, size, opts)


class _Packer(pickle.Pickler):
    def __init__(self, f, blobs: list):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.blobs, self.seen = blobs, {}

    def persistent_id(self, obj):
        if not isinstance(obj, torch.Tensor):
            return None
        key = id(obj)
        if key not in self.seen:
            raw = obj                                # a CPU tensor's numpy view: no copy until the join
            if raw.device.type != "cpu" or not raw.is_contiguous() or raw.dtype == torch.bfloat16:
                raw = raw.detach().cpu().contiguous().view(-1).view(torch.uint8)
            a = raw.numpy()
            self.blobs.append(a.data)
            self.seen[key] = (len(self.blobs) - 1, str(obj.dtype)[6:], tuple(obj.shape), a.nbytes)
        return self.seen[key]


def pack(*objs) -> bytes:
    """One step's forward arguments (any picklable objects holding tensors) as one message:
    [pickle length][pickle][tensor bytes ...]."""
    blobs: list[bytes] = []
    f = io.BytesIO()
    _Packer(f, blobs).dump(objs)
    head = f.getvalue()
    return b"".join([struct.pack("<q", len(head)), head, *blobs])


class _Unpacker(pickle.Unpickler):
    """Tensors are read back in the order they were first written: each takes the next blob."""

    def __init__(self, f, buf: bytearray, offset: int, device):
        super().__init__(f)
        self.buf, self.next, self.device, self.tensors = buf, offset, device, {}

    def persistent_load(self, pid):
        i, dtype, shape, nbytes = pid
        if i not in self.tensors:
            raw = torch.frombuffer(self.buf, dtype=torch.uint8, count=nbytes, offset=self.next) if nbytes \
                else torch.empty(0, dtype=torch.uint8)
            self.next += nbytes
            self.tensors[i] = raw.view(getattr(torch, dtype)).view(shape).to(self.device)
        return self.tensors[i]


def unpack(msg, device) -> tuple:
    """``pack``'s message -> the objects packed, their tensors on ``device`` (views of the message on a CPU)."""
    buf = bytearray(msg)
    (n,) = struct.unpack_from("<q", buf, 0)
    return _Unpacker(io.BytesIO(bytes(buf[8:8 + n])), buf, 8 + n, device).load()
