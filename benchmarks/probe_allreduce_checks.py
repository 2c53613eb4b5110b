"""probe_allreduce.py's correctness phases, run on every rank: ours against NCCL on the same inputs
(consecutive calls of every size, shuffled sizes, a rank made late on the host and on the GPU, graph
replays). At 2 ranks ours must equal NCCL bit for bit; above, within (W - 1) 2^-8 sum|x| (bf16)."""
from __future__ import annotations

import random
import time
import zlib


class Checks:
    """One rank's correctness phases: ours against NCCL on the same inputs (equal at W = 2, else bounded)."""

    def __init__(self, torch, rank, world, nccl, ar, dev, hiddens, batches, odd, graph_reps):
        self.torch, self.rank, self.world, self.nccl, self.ar, self.dev = torch, rank, world, nccl, ar, dev
        self.graph_reps = graph_reps
        self.out = dict(rank=rank, mismatches=[], checked=0)
        self.gen = torch.Generator(device=dev)
        self.shapes = [(b, h) for h in hiddens for b in batches] + [(1, n) for n in odd]
        self.order = random.Random(0).sample(self.shapes, len(self.shapes))
        self.late = rank == world - 1

    def data(self, shape, *key):
        self.gen.manual_seed(zlib.crc32(repr((self.rank,) + key).encode()))
        return self.torch.randn(shape, generator=self.gen, device=self.dev).to(self.torch.bfloat16)

    def compare(self, tag, xs, ys):
        """ys: ours for inputs xs (all launched already); NCCL's now, then equal (W=2) or within bound."""
        for i, (x, y) in enumerate(zip(xs, ys)):
            ref, mag = x.clone(), x.abs().float()
            self.nccl(ref), self.nccl(mag)
            diff = (y.float() - ref.float()).abs()
            bad = diff > 0 if self.world == 2 else diff > (self.world - 1) * 2 ** -8 * mag
            self.out["checked"] += 1
            if bool(bad.any()):
                self.out["mismatches"].append(dict(tag=tag, call=i, bytes=x.numel() * 2, elements=int(bad.sum()),
                                                   max_abs_diff=float(diff.max())))

    def calls(self):
        for b, h in self.shapes:
            xs = [self.data((b, h), "c", b, h, i) for i in range(3)]
            self.compare(f"3 calls [{b}, {h}]", xs, [self.ar(x.clone()) for x in xs])
        xs = [self.data(s, "mix", i) for i, s in enumerate(self.order)]
        self.compare("every shape, shuffled", xs, [self.ar(x.clone()) for x in xs])
        self.ar.check()

    def skew(self):
        torch = self.torch
        xs, ys = [self.data(s, "host", i) for i, s in enumerate(self.order[:3])], []
        for x in xs:
            torch.cuda.synchronize()
            if self.late:
                time.sleep(0.03)
            ys.append(self.ar(x.clone()))
        self.compare("last rank late (host sleep)", xs, ys)
        xs, ys = [self.data(s, "gpu", i) for i, s in enumerate(self.order[:8])], []
        for i, x in enumerate(xs):
            if self.late and i % 2 == 0:
                torch.cuda._sleep(2_000_000)                  # ~1 ms of GPU: rank 0 gets a call ahead
            ys.append(self.ar(x.clone()))
        self.compare("last rank late (GPU sleep, every other call)", xs, ys)
        self.ar.check()

    def graphs(self):
        torch = self.torch
        mix = [self.order[i % len(self.order)] for i in range(self.graph_reps)]
        xs = [self.data(s, "g", i) for i, s in enumerate(mix)]
        ys = [torch.empty_like(x) for x in xs]
        g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for x, y in zip(xs, ys):
                self.ar.all_reduce(x, out=y)
        for rep in range(3):
            for i, x in enumerate(xs):
                x.copy_(self.data(x.shape, "g", rep, i))
            if self.late and rep:
                torch.cuda._sleep(2_000_000)
            g.replay()
            self.compare(f"graph of {self.graph_reps} mixed calls, replay {rep}", xs, ys)
        torch.cuda.synchronize()
        self.ar.check()
