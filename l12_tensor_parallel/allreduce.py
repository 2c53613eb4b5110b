"""Our all-reduce for small messages: one Triton kernel over peer-mapped GPU memory (CUDA IPC, no
multicast), in place, capturable in a CUDA graph; NCCL (the ``fallback``) for the rest.

Memory. Each rank cudaMallocs one region, [signal pad | data: 2 halves of max_bytes], and sends
its IPC handle to the others (``exchange``: an all-gather of picklable objects, e.g.
``store_exchange``); each opens the peers' handles on its own GPU, so every rank holds every rank's
region address as an int64 that the kernel casts to a pointer. Pad slot [parity][program][source]
is an int64 written only by rank ``source``; ``calls`` (local) counts this rank's calls per program.

One call, program p of PROGS (all launched every call, so their counters stay equal; p owns the
chunks p, p + PROGS, ... of BLOCK elements, the same split on every rank since n is the same):

    epoch = ++calls[p]; h = epoch & 1
    copy my chunks of x into my data half h       (plain stores)
    debug_barrier; for each peer: atomic_xchg(peer pad[h][p][me], epoch, release, sys)
    for each peer: spin atomic_add(my pad[h][p][peer], 0, acquire, sys) == epoch; debug_barrier
    out[chunk] = round(sum over ranks 0..W-1 in fp32 of their half h)   (own from x; same order everywhere)

Why it is right. (1) Read after write: the peer's copy -> its CTA barrier -> its release at system
scope; our acquire of that value -> our CTA barrier -> our loads (.cv: from memory, not L1). The
data of chunk c is read only by program p, which waited for the flag of the program p that wrote
it. (2) Reuse with one barrier a call (double buffering): our call e writes half e&1. A peer's reads
of call e-1 are in the other half. Its reads of call e-2 (same half) are finished: our call e-1
kernel ended only after acquiring each peer's call-(e-1) flag, which the peer released from a kernel
that began after its call e-2 kernel ended (stream order) -> happens-before our call-e stores.
Needs n > 0 (some program signals) and consecutive calls ordered on one stream (no PDL).
(3) A rank ahead by one call writes pad[(e+1)&1], never the slot a slow peer still polls for e; it
cannot get two calls ahead, by (2). Epochs are int64 (no wrap), compared for equality.
(4) Graphs: the epoch lives in device memory, so replays advance it alike on every rank, as long as
every rank replays/launches the same sequence of calls (they do: the same forward pass).
Sum: fp32, rank order 0..W-1, rounded once: bitwise equal on every rank; with W = 2 it is the
correctly rounded a + b (fp32 has >= 2p + 2 bits of bf16/fp16's p), which is what NCCL's bf16 adds
give at W = 2. At W > 2 NCCL rounds W - 1 times: |ours - NCCL| <= (W-1) 2^-8 sum|x_r| (bf16).
Never hangs: a wait gives up after ``spin_limit`` polls, sets ``status`` and goes on (garbage);
``check()`` raises then. ``close()`` syncs, unmaps the peers and frees its region, waiting on nobody.
"""
from __future__ import annotations

import ctypes
import itertools
import pickle

import plumbing.runtime  # noqa: F401  (before triton: the interpreter on a CPU)
import torch
import triton
import triton.language as tl

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_BYTES = 2 << 20          # above this NCCL (2 MiB: a [256, 4096] bf16 activation)
PROGRAMS, BLOCK, WARPS = 32, 8192, 16
SPIN_LIMIT = 1 << 27         # polls before a wait gives up (the probe measures the seconds)


def eligible(t: torch.Tensor, device, max_bytes: int) -> bool:
    """Ours takes it: on this rank's device, a dtype we sum, contiguous, 16-byte aligned, 0 < bytes <= max_bytes."""
    return (t.device == torch.device(device) and t.dtype in DTYPES and t.is_contiguous() and t.data_ptr() % 16 == 0
            and 0 < t.numel() * t.element_size() <= max_bytes)


def pad_slot(parity: int, program: int, source: int, world: int, programs: int) -> int:
    """Index (int64 words) of pad[parity][program][source]; the kernel computes the same."""
    return (parity * programs + program) * world + source


def pad_bytes(world: int, programs: int) -> int:
    return (2 * programs * world * 8 + 255) // 256 * 256      # the data half starts 256-aligned


@triton.jit
def _at(x_ptr, addr):
    """The int64 address ``addr`` as x_ptr's type, written x_ptr + an offset that Triton is told is a
    multiple of 16 bytes (both are 16-byte aligned: ``eligible``), so that loads and stores move 16
    bytes a thread (a pointer cast from an int has unknown alignment: 2-byte moves)."""
    size: tl.constexpr = x_ptr.dtype.element_ty.primitive_bitwidth // 8
    return x_ptr + tl.multiple_of((addr - x_ptr.to(tl.int64)) // size, 16 // size)


@triton.jit
def _peer_all_reduce(x_ptr, out_ptr, bufs, pads, calls, status, n, half, spin_limit, PROGS,
                     RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    epoch = tl.load(calls + pid) + 1
    tl.store(calls + pid, epoch)
    par = epoch & 1
    chunks = tl.cdiv(n, BLOCK)
    if pid < chunks:
        dt = x_ptr.dtype.element_ty
        offs0 = tl.arange(0, BLOCK)
        mine = _at(x_ptr, tl.load(bufs + RANK)) + par * half
        for c in range(pid, chunks, PROGS):
            offs = c * BLOCK + offs0
            m = offs < n
            tl.store(mine + offs, tl.load(x_ptr + offs, mask=m), mask=m)
        tl.debug_barrier()                                     # every thread's copy before the release
        row = (par * PROGS + pid) * WORLD
        for r in tl.static_range(WORLD):
            if r != RANK:
                peer_pad = tl.load(pads + r).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(peer_pad + row + RANK, epoch, sem="release", scope="sys")
        my_pad = tl.load(pads + RANK).to(tl.pointer_type(tl.int64))
        for r in tl.static_range(WORLD):
            if r != RANK:
                spins = 0
                while (tl.atomic_add(my_pad + row + r, 0, sem="acquire", scope="sys") != epoch) & \
                        (spins < spin_limit):
                    spins += 1
                if spins >= spin_limit:
                    tl.store(status, 1)
        tl.debug_barrier()                                     # the acquire before every thread's loads
        for c in range(pid, chunks, PROGS):
            offs = c * BLOCK + offs0
            m = offs < n
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for r in tl.static_range(WORLD):
                if r == RANK:
                    v = tl.load(x_ptr + offs, mask=m)
                else:
                    src = _at(x_ptr, tl.load(bufs + r)) + par * half
                    v = tl.load(src + offs, mask=m, cache_modifier=".cv")
                acc += v.to(tl.float32)
            tl.store(out_ptr + offs, acc.to(dt), mask=m)


class _CudaRT:
    """The few CUDA runtime calls torch does not expose (IPC handles), through ctypes."""

    class Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_byte * 64)]

    def __init__(self):
        path = next((line.split()[-1] for line in open("/proc/self/maps") if "libcudart" in line), "libcudart.so.12")
        lib = self.lib = ctypes.CDLL(path)
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), self.Handle, ctypes.c_uint]

    def __call__(self, name, *args):
        err = getattr(self.lib, name)(*args)
        if err:
            raise RuntimeError(f"{name}: {self.lib.cudaGetErrorString(err).decode()}")

    def malloc_zeroed(self, device: int, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self("cudaSetDevice", device)                          # this library's own current device
        self("cudaMalloc", ctypes.byref(p), ctypes.c_size_t(nbytes))
        self("cudaMemset", p, 0, ctypes.c_size_t(nbytes))
        self("cudaDeviceSynchronize")
        return p.value

    def handle(self, ptr: int) -> bytes:
        h = self.Handle()
        self("cudaIpcGetMemHandle", ctypes.byref(h), ctypes.c_void_p(ptr))
        return bytes(h.reserved)

    def open(self, device: int, handle: bytes) -> int:
        p, h = ctypes.c_void_p(), self.Handle()
        ctypes.memmove(h.reserved, handle, 64)
        self("cudaSetDevice", device)
        self("cudaIpcOpenMemHandle", ctypes.byref(p), h, 1)   # cudaIpcMemLazyEnablePeerAccess
        return p.value


def store_exchange(store, rank: int, world: int, tag: str = "peer_all_reduce"):
    """An all-gather of picklable objects through a torch.distributed store (group.py and worker.py
    both hold one): exchange(obj) -> [rank 0's obj, rank 1's, ...]. Each use has its own keys."""
    uses = itertools.count()

    def exchange(obj):
        k = next(uses)
        store.set(f"{tag}/{k}/{rank}", pickle.dumps(obj))
        return [obj if r == rank else pickle.loads(store.get(f"{tag}/{k}/{r}")) for r in range(world)]
    return exchange


class PeerAllReduce:
    """One rank's side. ``ar(t)``: ours in place if ``eligible``, else ``fallback(t)`` (NCCL, in place);
    returns t. ``ar.all_reduce(t, out=None)``: ours only, out of place when ``out`` is given."""

    def __init__(self, rank: int, world: int, exchange, fallback=None, device=None, max_bytes: int = MAX_BYTES,
                 programs: int = PROGRAMS, block: int = BLOCK, num_warps: int = WARPS, spin_limit: int = SPIN_LIMIT):
        self.rank, self.world, self.fallback = rank, world, fallback
        self.device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
        self.max_bytes, self.programs, self.block, self.num_warps = max_bytes, programs, block, num_warps
        self.spin_limit, self.closed, self._opened, self._own = spin_limit, False, [], None
        if exchange is None:                                   # local(): the caller sets the addresses
            return
        self._rt = _CudaRT()
        dev, off = self.device.index, pad_bytes(world, programs)
        self._own = self._rt.malloc_zeroed(dev, off + 2 * max_bytes)
        handles = exchange((self._rt.handle(self._own), off + 2 * max_bytes))
        if any(size != off + 2 * max_bytes for _, size in handles):
            raise ValueError("peer all-reduce: the ranks were built with different sizes")
        bases = []
        for r, (h, _) in enumerate(handles):
            bases.append(self._own if r == rank else self._rt.open(dev, h))
            if r != rank:
                self._opened.append(bases[-1])
        self._addresses([b + off for b in bases], bases)

    def _addresses(self, bufs: list, pads: list) -> None:
        self.bufs = torch.tensor(bufs, dtype=torch.int64, device=self.device)
        self.pads = torch.tensor(pads, dtype=torch.int64, device=self.device)
        self.calls = torch.zeros(self.programs, dtype=torch.int64, device=self.device)
        self.status = torch.zeros(1, dtype=torch.int32, device=self.device)

    @classmethod
    def local(cls, world: int, device="cpu", **kw) -> list:
        """``world`` ranks' objects in one process over plain tensors (the tests: the interpreter runs
        one rank's launch at a time, so a test plays the peers' part of the protocol itself)."""
        programs, max_bytes = kw.get("programs", PROGRAMS), kw.get("max_bytes", MAX_BYTES)
        regions = [torch.zeros(pad_bytes(world, programs) + 2 * max_bytes, dtype=torch.uint8, device=device)
                   for _ in range(world)]
        ranks = [cls(r, world, None, device=device, **kw) for r in range(world)]
        for a in ranks:
            a.regions = regions
            a._addresses([t.data_ptr() + pad_bytes(world, programs) for t in regions], [t.data_ptr() for t in regions])
        return ranks

    def eligible(self, t: torch.Tensor) -> bool:
        return not self.closed and eligible(t, self.device, self.max_bytes)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if self.eligible(t):
            return self._launch(t, t)
        if self.fallback is None:
            raise ValueError(f"peer all-reduce: {t.dtype} {tuple(t.shape)} on {t.device} is not ours and there is "
                             "no fallback")
        self.fallback(t)
        return t

    def all_reduce(self, t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if not self.eligible(t):
            raise ValueError(f"peer all-reduce: not eligible ({t.dtype}, {tuple(t.shape)}, {t.device}, "
                             f"contiguous={t.is_contiguous()}, max {self.max_bytes} bytes)")
        return self._launch(t, t if out is None else out)

    def _launch(self, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        _peer_all_reduce[(self.programs,)](
            t, out, self.bufs, self.pads, self.calls, self.status, t.numel(), self.max_bytes // t.element_size(),
            self.spin_limit, self.programs, RANK=self.rank, WORLD=self.world, BLOCK=self.block,
            num_warps=self.num_warps)
        return out

    def check(self) -> None:
        """Raise if a wait ever gave up (a peer dead or hung): the ranks are out of step for good."""
        if int(self.status.item()):
            raise RuntimeError(f"peer all-reduce: rank {self.rank} waited {self.spin_limit} polls for a peer "
                               "that did not come; the ranks are out of step")

    def close(self) -> None:
        """Sync this GPU (our kernels end: waits are bounded), unmap the peers, free our region. Calls
        after it raise (``eligible`` is False: ``ar(t)`` falls back). Waits on no peer: a peer still
        reading our region must be done, which holds once every rank has synced or exited."""
        if self.closed:
            return
        self.closed = True
        if self._own is None:
            return
        torch.cuda.synchronize(self.device)
        for p in self._opened:
            self._rt("cudaIpcCloseMemHandle", ctypes.c_void_p(p))
        self._opened = []
        self._rt("cudaFree", ctypes.c_void_p(self._own))
        self._own = None
