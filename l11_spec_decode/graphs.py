"""CUDA graphs for uniform verify steps, beside stage 7's graphs for decode and prefill steps.

A verify step of B requests, each computing q = k + 1 tokens (its last known token and its k
guesses) and sampling at each, has one shape as long as B and q do: the speculator always gives
k guesses (speculator.py), so it replays one graph per batch bucket B <= ``disable_by_batch_size``
and q in 2..k+1 (near its length limit a request verifies fewer guesses). The padding sequences
are q tokens at positions 0..q-1 in the PAD block, as stage 7 pads a decode step; the capture is
stage 7's (``l7_fast.graphs.capture``), on the eager runner.

    step            runs
    uniform verify  a replay of (bucket(B), q)              "graph Bxq" in the runner's mode log
    other guesses   the eager runner (mixed counts, or a batch past the largest bucket)
    no guesses      the engine's runner (stage 7's decode and prefill graphs)
"""
from __future__ import annotations

import gc
import time

import torch

from l5_scheduler.runner import RunnerOutput
from l7_fast.graphs import capture


def uniform_verify(out) -> int | None:
    """q > 1 if every scheduled request computes q tokens and samples at every one of them."""
    S = len(out.scheduled)
    if not S or out.num_tokens % S:
        return None
    q = out.num_tokens // S
    return q if q > 1 and all([n == q and s == q for (_, n), s in zip(out.scheduled, out.sample)]) else None


def verify_keys(buckets, q: int, max_batch: int, max_tokens: int) -> list[tuple]:
    """The verify graphs to capture: (B, q') per bucket B <= max_batch and q' = 2..q, B q' tokens at
    most ``max_tokens`` (a step never holds more than the token budget: a bigger graph would be
    captured for nothing, on inputs sized for the budget)."""
    return [(B, j) for B in buckets if B <= max_batch for j in range(2, q + 1) if B * j <= max_tokens]


class VerifyGraphs:
    def __init__(self, runner, q: int, max_batch: int):
        self.runner = runner                         # the eager FastRunner: captures, and runs the rest
        self.graphs: dict[tuple, tuple] = {}         # (B, q') -> the graph, its static outputs
        r, t0 = runner, time.perf_counter()
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        before, pool, stream = torch.cuda.memory_reserved(), None, torch.cuda.Stream()
        keys = verify_keys(r.buckets, q, max_batch, r.config.max_num_batched_tokens)
        for B, j in sorted(keys, key=lambda key: -key[0] * key[1]):
            self.graphs[(B, j)] = capture(r, r.buf.pad_only(B, r.cache.pad_slot, j), j, 1, pool, stream)
            pool = self.graphs[(B, j)][0].pool()
        torch.cuda.synchronize()
        self.graph_bytes, self.capture_s = torch.cuda.memory_reserved() - before, time.perf_counter() - t0

    def replay_bucket(self, out) -> tuple | None:
        """The graph this step replays, (bucket(B), q), or None (eager), as stage 7's GraphRunner says."""
        q = uniform_verify(out)
        key = (self.runner.bucket(len(out.scheduled)), q) if q is not None else None
        return key if key in self.graphs else None

    def execute(self, out) -> RunnerOutput | None:
        """A replay if the step is a captured uniform verify step; None: run it eagerly."""
        key = self.replay_bucket(out)
        if key is None:
            return None
        q, r = key[1], self.runner
        lay, _ = r.prepare(out, pad_to=key[0])
        if r.check:
            r.check_step(out, lay, q)
        graph, logits, meta, argmax = self.graphs[key]
        graph.replay()
        r.mode_log.append(f"graph {key[0]}x{q}")
        rows = len(out.scheduled) * q
        return RunnerOutput(logits[:rows], meta, argmax[:rows])
