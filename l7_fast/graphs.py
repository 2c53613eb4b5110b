"""CUDA graphs: a decode step's whole forward pass launched at once.

A decode step of Qwen3-0.6B runs ~300 small kernels; launched one by one from Python, the host
is slower than the GPU. A CUDA graph records the launches once and replays them with one call.
A graph replays fixed addresses and shapes, so:

    buckets     one graph per batch size B in graph_buckets(max_num_seqs) (runner.py): 1, 2, 4, 8,
                16, 32, ...
    replay      a uniform decode step of n requests (each computes one token and samples it)
                replays the graph of the smallest B >= n, with B - n padding rows (cache.py:
                position 0, K/V length 1, the PAD block), inputs written into the same pinned
                buffer offsets the capture read (step_inputs.py)
    prefill     a step of one request computing n > 1 prompt tokens and sampling after the last
                (a short prompt alone: the time to first token) replays the graph of the smallest
                T in prefill_buckets() above n, its T - n tokens one padding sequence (positions
                0.., PAD slots, the PAD row); the graph's attention tile is T's, not n's
    eager       everything else: steps of several prefills or of decodes and chunks mixed, a
                prompt's chunk that does not sample, a decode-shaped step whose one-token row does
                not sample (fewer logits rows, another byte layout), a batch above the last
                bucket, ``enforce_eager``

``GraphRunner`` wraps the eager ``FastRunner`` (runner.py): it captures with it, replays, and
hands it every step it cannot replay. Each graph also computes the rows' argmax (the sampler's
all-greedy branch takes it from the runner's output, so a greedy batch launches nothing after the
replay; for other batches it is a small wasted read of the logits). The torch reference attention (``impl="torch"``) loops on
the host and copies per sequence: it cannot be captured, so it always runs eagerly.
"""
from __future__ import annotations

import gc
import time

import torch

from l5_scheduler.runner import RunnerOutput

from .runner import is_uniform_decode, one_prefill

PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512)


def prefill_buckets(config) -> list[int]:
    """Token counts with a prefill graph: those of PREFILL_BUCKETS within the step budget and the
    context (none if a step holds one sequence: the padding is a second one)."""
    top = min(config.max_num_batched_tokens, config.max_model_len)
    return [T for T in PREFILL_BUCKETS if T <= top] if config.max_num_seqs >= 2 else []


def graph_keys(buckets, prefill) -> list[tuple]:
    """The graphs to capture: (B, 1) per decode bucket; ("prefill", T) per prefill bucket."""
    return [(B, 1) for B in buckets] + [("prefill", T) for T in prefill]


def step_key(out, bucket, prefill) -> tuple | None:
    """The graph key a step would replay if it was captured (graph_keys), or None: the step is eager."""
    if is_uniform_decode(out):
        return (bucket(len(out.scheduled)), 1)
    t = one_prefill(out)
    T = next((T for T in prefill if T > t), None) if t is not None else None
    return ("prefill", T) if T is not None else None


def capture(r, lay, q: int, splits: int, pool, stream) -> tuple:
    """One CUDA graph of the eager runner ``r``'s forward pass on the padding step ``lay`` (q tokens
    a sequence), in the memory ``pool`` (None: a new one). Returns the graph and its static outputs
    (logits, meta, the rows' argmax), which every replay overwrites."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):                  # warm up: compile kernels, settle allocations
        for _ in range(2):
            r.forward(lay, q, r.config.max_model_len, splits)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        logits, meta = r.forward(lay, q, r.config.max_model_len, splits)
        argmax = logits.argmax(-1)                   # [B q]: for an all-greedy batch, no launch after the replay
    return graph, logits, meta, argmax


class GraphRunner:
    def __init__(self, runner, prefill: bool = True):
        self.runner = runner                         # the eager FastRunner: captures, and runs the rest
        self.prefill = prefill_buckets(runner.config) if prefill else []
        self.graphs: dict[tuple, tuple] = {}         # (B, q) or ("prefill", T) -> the graph, its static outputs
        self.graph_bytes, self.capture_s = 0, 0.0
        self.capture()

    # what tests, scripts and the engine read through the runner part
    cache = property(lambda self: self.runner.cache)
    buf = property(lambda self: self.runner.buf)
    ops = property(lambda self: self.runner.ops)
    split_kv = property(lambda self: self.runner.split_kv)
    mode_log = property(lambda self: self.runner.mode_log)
    warmup_report = property(lambda self: self.runner.warmup_report)

    def capture(self) -> None:
        """One graph per bucket, largest first, all sharing one memory pool."""
        r = self.runner
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        gc.collect()                                 # torch.cuda.graph does both on entry: measure from there,
        torch.cuda.empty_cache()                     # or freed cache shows up as negative graph memory
        before = torch.cuda.memory_reserved()
        pool = None
        stream = torch.cuda.Stream()                 # one warm-up stream (cuBLAS keeps a workspace per stream)
        for key in sorted(graph_keys(r.buckets, self.prefill), key=lambda s: -s[1] if s[0] == "prefill" else -s[0]):
            if key[0] == "prefill":
                lay, q, splits = r.buf.pad_prefill(key[1], r.cache.pad_slot), key[1], 1
            else:
                lay, q, splits = r.buf.pad_only(key[0], r.cache.pad_slot), 1, r.decode_splits(key[0])
            self.graphs[key] = capture(r, lay, q, splits, pool, stream)
            pool = self.graphs[key][0].pool()        # every graph in one memory pool
        torch.cuda.synchronize()
        self.graph_bytes = torch.cuda.memory_reserved() - before
        self.capture_s = time.perf_counter() - t0

    def replay_bucket(self, out) -> tuple | None:
        """The graph this step replays, or None (eager): (B, 1) for a uniform decode step, B the
        bucket it fits; ("prefill", T) for one request's prefill of fewer than T tokens."""
        key = step_key(out, self.runner.bucket, self.prefill)
        return key if key in self.graphs else None

    def execute(self, out):
        """Returns logits [S', V] float32 for the rows that sample, and the step's metadata."""
        key = self.replay_bucket(out)
        if key is None:
            return self.runner.execute(out)
        r = self.runner
        if key[0] == "prefill":
            (_, q), rows, label = key, 1, f"graph prefill {key[1]}"
            lay, _ = r.prepare(out, pad_tokens=q)
        else:
            (B, q), rows, label = key, len(out.scheduled), f"graph {key[0]}"
            lay, _ = r.prepare(out, pad_to=B)
        if r.check:
            r.check_step(out, lay, q)
        graph, logits, meta, argmax = self.graphs[key]
        graph.replay()
        r.mode_log.append(label)
        return RunnerOutput(logits[:rows], meta, argmax[:rows])   # meta: the captured views, this step's values
