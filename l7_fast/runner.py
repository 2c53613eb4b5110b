"""The fast model runner: persistent inputs, fused ops, split-KV decode (eager; graphs.py adds
CUDA graphs on top of it).

Stage 5's runner, step by step, against this one:

    stage 5                                      stage 7
    7 torch.tensor(list) copies, table re-sent   1 pinned copy; only new block-table entries
    layout checks in every layer's attention     checked once per step (--check) or never
    the skeleton's torch ops                     ``ops``: FusedOps (ops.py) or TorchOps
    stage 3's kernel: 1 program per (seq, head)  split-KV: the keys of a sequence over many programs

The runner keeps state between steps (each running request's block-table row), so it reads what
changed from the scheduler's output: ``finished_ids`` and ``preempted`` give their rows back,
``new_blocks`` are the only block-table entries sent. It never looks at anything else to decide.

A *uniform decode* step (every scheduled request computes one token and samples it: the common
step) builds its inputs with one comprehension per field; any other step (prefill chunks) takes
the general loop. The split count of a decode step is a function of its batch bucket only
(``decode_splits``), so a CUDA-graph replay and an eager step of the same batch do the same
arithmetic.
"""
from __future__ import annotations

import numpy as np
import torch

from l5_scheduler.runner import RunnerOutput, fill_pending
from plumbing.exercise import learner_can_replace

from .attention_split import _num_sms
from .cache import FastKVCache, FastMeta
from .step_inputs import Layout, StepInputs


@learner_can_replace  # lesson 7's build-it exercise: exercises/l7_fast.py
def graph_buckets(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a CUDA graph (graphs.py): 1, 2, 4, 8, then every 16, up to and
    including max_num_seqs (vLLM uses 1, 2, 4, then 8s)."""
    b = [x for x in (1, 2, 4, 8) if x < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return b + [max_num_seqs]


def is_uniform_decode(out) -> bool:
    """Every scheduled request computes exactly one token and samples it."""
    return out.num_tokens == len(out.scheduled) and all(out.sample)


def uniform_verify(out) -> int | None:
    """q > 1 if every scheduled request computes q tokens and samples at every one of them: its last
    known token and q - 1 guesses (lesson 11's verify step). Such a step can replay a graph too."""
    S = len(out.scheduled)
    if not S or out.num_tokens % S or out.num_tokens == S or not all(out.sample):
        return None
    q = out.num_tokens // S
    return q if all([n == q and len(req.spec_ids) == q - 1 for req, n in out.scheduled]) else None


def one_prefill(out) -> int | None:
    """n > 1 if the step is one request computing n prompt tokens and sampling after the last: a
    short prompt alone, or a long one's last chunk. Such a step can replay a prefill graph."""
    if len(out.scheduled) != 1 or not out.sample[0]:
        return None
    req, n = out.scheduled[0]
    return n if n > 1 and not req.spec_ids else None


class FastRunner:
    def __init__(self, model, config, ops, *, impl: str = "triton", check: bool = False, split_kv: bool = True,
                 cache: FastKVCache | None = None):
        """``cache``: the KV cache part (default: a FastKVCache; stage 8 gives one that also
        implements sliding windows), as the scheduler is given its KV manager."""
        p = next(model.parameters())
        self.model, self.device, self.block_size = model, p.device, config.block_size
        self.cfg, self.config, self.check, self.ops = model.cfg, config, check, ops
        self.cache = cache if cache is not None else FastKVCache(model.cfg, config.num_blocks, config.block_size,
                                                                 p.device, p.dtype, impl=impl)
        self.split_kv = split_kv and impl == "triton"
        width = -(-config.max_model_len // config.block_size)
        self.buf = StepInputs(config.max_num_batched_tokens, config.max_num_seqs, config.max_num_seqs + 1,
                              width, self.cache.pad_block, p.device)
        self.buckets = graph_buckets(config.max_num_seqs)
        self._arange = np.arange(config.max_num_seqs + 2)     # cu_seqlens and logits rows of a decode step
        self.mode_log: list[str] = []                # every step's mode: "eager" or "graph B" (graphs.py)
        self.warmup_report = None                    # warmup.WarmupReport, after start-up on a GPU (llm.py)

    # ---- the split choice: host ints only -------------------------------------------------------
    def decode_splits(self, batch: int) -> int:
        if not self.split_kv:
            return 1
        return self.cache.num_splits(batch, self.config.max_model_len, _num_sms(self.device))

    def step_splits(self, n: int, decode: bool) -> int:
        """Key splits of a step of n sequences: a decode step splits as a replay of its bucket would."""
        return self.decode_splits(self.bucket(n) or n) if decode else 1

    def bucket(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    # ---- host side: one pass over the scheduled requests ----------------------------------------
    def prepare(self, out, pad_to: int | None = None, pad_tokens: int | None = None):
        """Fill the pinned buffer for this step and copy it. Returns (layout, max K/V length).
        ``pad_to``: a graph replay's batch (a uniform step: decode, or lesson 11's verify).
        ``pad_tokens``: a prefill graph's token count (graphs.py), reached with one padding sequence."""
        upd_index, upd_block = [], []
        self.buf.update_rows(out, upd_index, upd_block)
        if is_uniform_decode(out):
            return self._prepare_decodes(out, pad_to, upd_index, upd_block)
        ids, positions, slots, cu, seq_lens, logits = [], [], [], [0], [], []
        t = 0
        for (req, n), sample in zip(out.scheduled, out.sample):
            kv = req.kv
            start = kv.cur_len
            ids += req.tokens(start, n)
            positions += range(start, start + n)
            slots += kv.slot_indices[start:start + n]
            t += n
            cu.append(t)
            seq_lens.append(start + n)
            if sample:                               # the last known token, and any drafts after it (lesson 11)
                logits.extend(range(t - 1 - len(req.spec_ids), t))
        rows = self.buf.rows_for(out.scheduled)
        if pad_to is not None and pad_to > len(seq_lens):   # a graph replay of a uniform verify step (graphs.py):
            q, k = t // len(seq_lens), pad_to - len(seq_lens)   # padding sequences of q tokens at 0..q-1, PAD slots
            ids, positions = ids + [0] * (q * k), positions + list(range(q)) * k
            slots, logits = slots + [self.cache.pad_slot] * (q * k), logits + list(range(t, t + q * k))
            cu, seq_lens = cu + list(range(t + q, t + q * k + 1, q)), seq_lens + [q] * k
            rows, t = rows + [self.buf.pad_row] * k, t + q * k
        if pad_tokens is not None:                   # a prefill graph's replay: one padding sequence of k tokens
            k = pad_tokens - t                       # at 0..k-1 (PAD slots, the PAD row), its last a logits row
            ids, positions, slots = ids + [0] * k, positions + list(range(k)), slots + [self.cache.pad_slot] * k
            logits, cu, seq_lens = logits + [pad_tokens - 1], cu + [pad_tokens], seq_lens + [k]
            rows, t = rows + [self.buf.pad_row], pad_tokens
        lay = Layout(t, len(seq_lens), len(logits), len(upd_index))
        self.buf.write(lay, ids, positions, slots, logits, cu, seq_lens, rows, upd_index, upd_block)
        self._upload(lay, out)
        return lay, max(seq_lens)

    def _prepare_decodes(self, out, pad_to, upd_index, upd_block):
        """``prepare`` for a uniform decode step: one comprehension per field; K/V length = position + 1."""
        kvs = [req.kv for req, _ in out.scheduled]
        positions = [kv.cur_len for kv in kvs]
        ids = [(req.output_ids or req.prompt_ids)[-1] for req, _ in out.scheduled]   # the last known token
        slots = [kv.slot_indices[p] for kv, p in zip(kvs, positions)]
        rows = self.buf.rows_for(out.scheduled)
        S = len(kvs)
        max_kv = max(positions) + 1
        if pad_to is not None and pad_to > S:        # padding rows of a graph bucket: position 0, PAD block
            k = pad_to - S
            ids += [0] * k
            positions += [0] * k
            slots += [self.cache.pad_slot] * k
            rows += [self.buf.pad_row] * k
            S = pad_to
        lay = Layout(S, S, S, len(upd_index))
        self.buf.write(lay, ids, positions, slots, self._arange[:S], self._arange[:S + 1], None, rows,
                       upd_index, upd_block)                  # seq_lens None: positions + 1
        self._upload(lay, out)
        return lay, max_kv

    def _upload(self, lay: Layout, out) -> None:
        """The step's one copy, then the ids still on the device put in place (async scheduling, engine.py)."""
        self.buf.upload(lay)
        fill_pending(self.buf.view(lay.ids, torch.int64, lay.T), out.scheduled)

    def meta(self, lay: Layout, max_seqlen_q: int, max_seqlen_kv: int, num_splits: int):
        f = self.buf.tensors(lay)
        block_table = self.buf.table.index_select(0, f["rows"])      # [S, W]: one gather launch
        meta = FastMeta(positions=f["positions"], slot_mapping=f["slot_mapping"], cu_seqlens_q=f["cu_seqlens_q"],
                        seq_lens_kv=f["seq_lens_kv"], block_table=block_table, block_size=self.block_size,
                        max_seqlen_q=max_seqlen_q, logits_indices=f["logits_indices"],
                        max_seqlen_kv=max_seqlen_kv, num_splits=num_splits,
                        pdl=getattr(self.ops, "pdl", False))      # FusedOps decides (TorchOps: never)
        return f["input_ids"], meta

    def forward(self, lay: Layout, max_seqlen_q: int, max_seqlen_kv: int, num_splits: int):
        input_ids, meta = self.meta(lay, max_seqlen_q, max_seqlen_kv, num_splits)
        return self.model(input_ids, self.cache, meta, ops=self.ops), meta

    # ---- one step -------------------------------------------------------------------------------
    def execute(self, out):
        """One eager forward pass. Returns logits [S', V] float32 for the rows that sample, and the metadata."""
        n = len(out.scheduled)
        lay, max_kv = self.prepare(out)
        decode = out.num_tokens == n                 # every scheduled request computes one token
        splits = self.step_splits(n, decode)
        max_q = 1 if decode else max([m for _, m in out.scheduled])
        if self.check:
            self.check_step(out, lay, max_q)
        self.mode_log.append("eager")
        return RunnerOutput(*self.forward(lay, max_q, max_kv, splits))

    def check_step(self, out, lay: Layout, max_q: int) -> None:
        """--check (syncs): the layout once per step, and the incremental block table against the
        block lists it stands for."""
        f = self.buf.tensors(lay)
        table = self.buf.table.index_select(0, f["rows"])
        dtype = next(self.model.parameters()).dtype                      # q's: the model's
        q = torch.empty(lay.T, self.cfg.num_heads, self.cfg.head_dim, device=self.device, dtype=dtype)
        self.cache.check_layout(q, f["cu_seqlens_q"], f["seq_lens_kv"], table)
        rows = table.tolist()
        for s, (req, n) in enumerate(out.scheduled):
            need = -(-(req.kv.cur_len + n) // self.block_size)
            if rows[s][:need] != req.kv.blocks[:need]:
                raise RuntimeError(f"block table row of {req.request_id} is {rows[s][:need]}, its blocks are "
                                   f"{req.kv.blocks[:need]}: the incremental update lost a change (a bug)")
