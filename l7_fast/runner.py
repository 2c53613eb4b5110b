"""The fast model runner: persistent inputs, fused ops, split-KV decode, CUDA graphs.

Stage 5's runner, step by step, against this one:

    stage 5                                      stage 7
    7 torch.tensor(list) copies, table re-sent   1 pinned copy; only new block-table entries
    layout checks in every layer's attention     checked once per step (--check) or never
    ~58 launches per layer, each ~10 us of       decode: one CUDA graph replay for the whole
      Python + driver time                         forward (capture once per batch bucket)
    stage 3's kernel: 1 program per (seq, head)  split-KV: the keys of a sequence over many programs

A decode-only step of n requests replays the graph of the smallest bucket B >= n (buckets 1, 2,
4, 8, then every 16 up to max_num_seqs), with B - n padding rows (cache.py). Steps with prefill
chunks, steps larger than the last bucket, and ``enforce_eager`` run the same forward eagerly.
The split count of a decode step is a function of its bucket only (``decode_splits``), in both
modes, so a graph replay and an eager step of the same batch do the same arithmetic.
"""
from __future__ import annotations

import gc
import time

import numpy as np
import torch

from l1_dense.exercise import learner_can_replace
from l1_dense.model import TorchOps
from l3_paged.validate import check_paged_layout

from .attention_split import _num_sms, pick_num_splits
from .cache import FastKVCache, FastMeta
from .ops import FusedOps
from .step_inputs import Layout, StepInputs


@learner_can_replace  # lesson 7's build-it exercise: exercises/l7_fast.py
def graph_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16, up to and including max_num_seqs (vLLM uses 1, 2, 4, then 8s)."""
    b = [x for x in (1, 2, 4, 8) if x < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return b + [max_num_seqs]


class FastRunner:
    def __init__(self, model, config, *, impl: str = "triton", check: bool = False, enforce_eager: bool = False,
                 fused_ops: bool = True, split_kv: bool = True, host_fast_path: bool = True):
        p = next(model.parameters())
        self.model, self.device, self.block_size = model, p.device, config.block_size
        self.cfg, self.config, self.check = model.cfg, config, check
        self.cache = FastKVCache(model.cfg, config.num_blocks, config.block_size, p.device, p.dtype, impl=impl)
        self.ops = FusedOps(model) if fused_ops else TorchOps()
        self.split_kv = split_kv and impl == "triton"
        self.host_fast_path = host_fast_path          # decode steps: _prepare_decodes (engine.py, host.py)
        width = -(-config.max_model_len // config.block_size)
        self.buf = StepInputs(config.max_num_batched_tokens, config.max_num_seqs, config.max_num_seqs + 1,
                                 width, self.cache.pad_block, p.device)
        # The torch reference attention (impl="torch") loops on the host and copies per sequence:
        # it cannot be captured, so it always runs eagerly.
        self.use_graphs = not enforce_eager and p.device.type == "cuda" and impl == "triton"
        self.buckets = graph_buckets(config.max_num_seqs)
        self._arange = np.arange(config.max_num_seqs + 2)     # cu_seqlens and logits rows of a decode step
        self.graphs: dict[int, tuple] = {}
        self.graph_bytes, self.capture_s = 0, 0.0
        self.last_mode = None                        # "graph B" or "eager" (tests, --profile)
        self.last_greedy = None                      # a replay's argmax of its logits [n] (the graph computes it)
        self.mode_log: list[str] = []                # every step's mode
        self.profile, self.last_wait = False, 0.0    # profile: sync after the forward, time the wait
        if self.use_graphs:
            self.capture()

    # ---- the split choice: host ints only -------------------------------------------------------
    def decode_splits(self, batch: int) -> int:
        if not self.split_kv:
            return 1
        return pick_num_splits(batch, self.cfg.num_kv_heads, self.config.max_model_len, _num_sms(self.device))

    def bucket(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    # ---- host side: one pass over the scheduled requests ----------------------------------------
    def prepare(self, out, pad_to: int | None = None, decode: bool | None = None):
        """Fill the pinned buffer for this step and copy it. Returns (layout, max K/V length).
        ``decode``: every scheduled request computes one token (the caller may know already)."""
        if decode is None:
            decode = out.num_tokens == len(out.scheduled)
        if decode and self.host_fast_path and all(out.sample):
            return self._prepare_decodes(out, pad_to)
        ids, positions, slots, cu, seq_lens, rows, logits = [], [], [], [0], [], [], []
        upd_index, upd_block = [], []
        row_of = self.buf.row_of
        t = 0
        for (req, n), sample in zip(out.scheduled, out.sample):
            kv = req.kv
            start = kv.cur_len
            end = start + n
            if n == 1:                               # a decode: the token at position start
                P = len(req.prompt_ids)
                ids.append(req.prompt_ids[start] if start < P else req.output_ids[start - P])
                positions.append(start)
                slots.append(kv.slot_indices[start])
            else:
                ids += req.tokens(start, n)
                positions += range(start, end)
                slots += kv.slot_indices[start:end]
            t += n
            cu.append(t)
            seq_lens.append(end)
            rows.append(row_of(req.request_id, kv, upd_index, upd_block))
            if sample:
                logits.append(t - 1)
        S = len(seq_lens)
        if pad_to is not None and pad_to > S:        # padding rows of a graph bucket: PAD block only
            k = pad_to - S
            ids += [0] * k
            positions += [0] * k
            slots += [self.cache.pad_slot] * k
            cu += range(t + 1, t + k + 1)
            seq_lens += [1] * k
            rows += [self.buf.pad_row] * k
            logits += range(t, t + k)
            t, S = t + k, pad_to
        lay = Layout(t, S, len(logits), len(upd_index))
        self.buf.write(lay, ids, positions, slots, logits, cu, seq_lens, rows, upd_index, upd_block)
        self.buf.upload(lay)
        return lay, max(seq_lens)

    def _prepare_decodes(self, out, pad_to: int | None):
        """``prepare`` for a step where every request computes its last token (the common decode
        step): one comprehension per field instead of a loop, and block-table changes only for the
        requests the scheduler says grew (``StepPlan.grown``)."""
        reqs = [req for req, _ in out.scheduled]
        kvs = [req.kv for req in reqs]
        positions = [kv.cur_len for kv in kvs]
        ids = [(req.output_ids or req.prompt_ids)[-1] for req in reqs]      # the last known token
        slots = [kv.slot_indices[p] for kv, p in zip(kvs, positions)]
        upd_index, upd_block = [], []
        rows = self.buf.rows_of(reqs, kvs, upd_index, upd_block, getattr(out, "grown", None))
        S = len(reqs)
        max_kv = max(positions) + 1
        if pad_to is not None and pad_to > S:        # padding rows: position 0, K/V length 1, PAD
            k = pad_to - S
            ids += [0] * k
            positions += [0] * k
            slots += [self.cache.pad_slot] * k
            rows += [self.buf.pad_row] * k
            S = pad_to
        lay = Layout(S, S, S, len(upd_index))
        self.buf.write(lay, ids, positions, slots, self._arange[:S], self._arange[:S + 1], None, rows,
                       upd_index, upd_block)                  # seq_lens None: positions + 1
        self.buf.upload(lay)
        return lay, max_kv

    def meta(self, lay: Layout, max_seqlen_q: int, max_seqlen_kv: int, num_splits: int):
        f = self.buf.tensors(lay)
        block_table = self.buf.table.index_select(0, f["rows"])      # [S, W]: one gather launch
        meta = FastMeta(positions=f["positions"], slot_mapping=f["slot_mapping"], cu_seqlens_q=f["cu_seqlens_q"],
                        seq_lens_kv=f["seq_lens_kv"], block_table=block_table, block_size=self.block_size,
                        max_seqlen_q=max_seqlen_q, logits_indices=f["logits_indices"],
                        max_seqlen_kv=max_seqlen_kv, num_splits=num_splits)
        return f["input_ids"], meta

    def forward(self, lay: Layout, max_seqlen_q: int, max_seqlen_kv: int, num_splits: int):
        input_ids, meta = self.meta(lay, max_seqlen_q, max_seqlen_kv, num_splits)
        return self.model(input_ids, self.cache, meta, ops=self.ops), meta

    # ---- CUDA graphs ----------------------------------------------------------------------------
    def capture(self) -> None:
        """One graph per bucket, largest first, all sharing one memory pool."""
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        gc.collect()                                 # torch.cuda.graph does both on entry: measure from there,
        torch.cuda.empty_cache()                     # or freed cache shows up as negative graph memory
        before = torch.cuda.memory_reserved()
        pool, L = None, self.config.max_model_len
        stream = torch.cuda.Stream()                 # one warm-up stream (cuBLAS keeps a workspace per stream)
        for B in sorted(self.buckets, reverse=True):
            lay = self._pad_only(B)
            splits = self.decode_splits(B)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):          # warm up: compile kernels, settle allocations
                for _ in range(2):
                    self.forward(lay, 1, L, splits)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits, meta = self.forward(lay, 1, L, splits)
                greedy = logits.argmax(-1) if self.host_fast_path else None   # [B] greedy ids, same replay
            pool = graph.pool()
            self.graphs[B] = (graph, logits, greedy, meta)   # static outputs: overwritten by every replay
        torch.cuda.synchronize()
        self.graph_bytes = torch.cuda.memory_reserved() - before
        self.capture_s = time.perf_counter() - t0

    def _pad_only(self, B: int) -> Layout:
        """A step of B padding rows: the inputs of a capture."""
        pad = self.buf.pad_row
        lay = Layout(B, B, B, 0)
        self.buf.write(lay, [0] * B, [0] * B, [self.cache.pad_slot] * B, list(range(B)), list(range(B + 1)),
                          [1] * B, [pad] * B, [], [])
        self.buf.upload(lay)
        return lay

    # ---- one step -------------------------------------------------------------------------------
    def execute(self, out):
        """Returns logits [S', V] float32 for the rows that sample, and the step's metadata."""
        logits, meta = self._execute(out)
        self.mode_log.append(self.last_mode)
        if self.profile and self.device.type == "cuda":   # the sampler syncs next anyway: wait here, timed
            t0 = time.perf_counter()
            torch.cuda.synchronize()
            self.last_wait = time.perf_counter() - t0
        return logits, meta

    def replay_bucket(self, out, n: int, decode: bool) -> int | None:
        """The graph this step replays, or None (eager). A graph was captured for B rows that each
        compute one token and each give a logits row; a step whose one-token row does not sample (a
        chunk of an unfinished prompt, when the budget left it one token) has another layout: eager."""
        if not (self.use_graphs and decode) or not all(out.sample):
            return None
        return self.bucket(n)

    def _execute(self, out):
        n = len(out.scheduled)
        decode = out.num_tokens == n                 # every scheduled request computes one token
        B = self.replay_bucket(out, n, decode)
        if B is not None:
            lay, _ = self.prepare(out, pad_to=B, decode=True)
            if self.check:
                self.check_step(out, lay, 1)
            graph, logits, greedy, meta = self.graphs[B]
            graph.replay()
            self.last_mode = f"graph {B}"
            self.last_greedy = greedy[:n] if greedy is not None else None
            return logits[:n], meta                  # meta: the captured views, this step's values
        lay, max_kv = self.prepare(out, decode=decode)
        splits = self.decode_splits(self.bucket(n) or n) if decode else 1   # as a replay of this batch would
        max_q = 1 if decode else max(n for _, n in out.scheduled)
        if self.check:
            self.check_step(out, lay, max_q)
        logits, meta = self.forward(lay, max_q, max_kv, splits)
        self.last_mode = "eager"
        self.last_greedy = None
        return logits, meta

    def check_step(self, out, lay: Layout, max_q: int) -> None:
        """--check (syncs): the layout once per step, and the incremental block table against the
        block lists it stands for."""
        f = self.buf.tensors(lay)
        table = self.buf.table.index_select(0, f["rows"])
        q = torch.empty(lay.T, self.cfg.num_heads, self.cfg.head_dim, device=self.device, dtype=self.cache.K[0].dtype)
        check_paged_layout(q, self.cache.K[0], self.cache.V[0], f["cu_seqlens_q"], f["seq_lens_kv"], table)
        rows = table.tolist()
        for s, (req, n) in enumerate(out.scheduled):
            need = -(-(req.kv.cur_len + n) // self.block_size)
            if rows[s][:need] != req.kv.blocks[:need]:
                raise RuntimeError(f"block table row of {req.request_id} is {rows[s][:need]}, its blocks are "
                                   f"{req.kv.blocks[:need]}: the incremental update lost a change (a bug)")

    def release(self, request_id: str) -> None:
        self.buf.release(request_id)
