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

from l4_sampler.sampler import to_device
from l5_scheduler.runner import RunnerOutput, logits_rows, split_prompt_rows
from plumbing.exercise import learner_can_replace

from .attention_split import _num_sms
from .step_inputs import Layout, StepInputs


@learner_can_replace  # lesson 7's build-it exercise: exercises/l7_fast.py
def graph_buckets(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a CUDA graph (graphs.py): 1, 2, 4, 8, then every 16, up to and
    including max_num_seqs (vLLM uses 1, 2, 4, then 8s)."""
    b = [x for x in (1, 2, 4, 8) if x < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return b + [max_num_seqs]


def is_uniform_decode(out) -> bool:
    """Every scheduled request computes exactly one token and samples it."""
    return out.num_tokens == len(out.scheduled) and all(out.sample) and out.prompt_rows is None


def one_prefill(out) -> int | None:
    """n > 1 if the step is one request computing n prompt tokens and sampling after the last: a
    short prompt alone, or a long one's last chunk. Such a step can replay a prefill graph."""
    if len(out.scheduled) != 1 or out.sample[0] != 1 or out.prompt_rows:   # (one logits row: its last token's)
        return None
    n = out.scheduled[0][1]
    return n if n > 1 else None


def step_inputs(config, device, pad_block: int, table_rows: int | None = None) -> StepInputs:
    """The runner's pinned inputs for these sizes: a block-table row per running request (or
    ``table_rows``), as wide as max_model_len."""
    width = -(-config.max_model_len // config.block_size)
    return StepInputs(config.max_num_batched_tokens, config.max_num_seqs, table_rows or config.max_num_seqs + 1,
                      width, pad_block, device)


class FastRunner:
    def __init__(self, model, config, ops, *, cache, inputs: StepInputs | None = None, check: bool = False,
                 split_kv: bool = True):
        """``cache``: the KV cache part (cache.py, or a later stage's), ``inputs``: the step inputs
        (default: ``step_inputs``), as the scheduler is given its KV manager."""
        p = next(model.parameters())
        self.model, self.device, self.block_size = model, p.device, config.block_size
        self.cfg, self.config, self.check, self.ops, self.cache = model.cfg, config, check, ops, cache
        self.split_kv = split_kv and cache.impl == "triton"
        self.buf = inputs if inputs is not None else step_inputs(config, p.device, cache.pad_block)
        self.in_flight: dict[str, tuple] = {}        # request id -> (device ids, row): tokens not on the host yet (step.py)
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
        ``pad_to``: a graph replay's batch B (a uniform step: every sequence q tokens, each sampling;
        padded with B - S sequences of q tokens). ``pad_tokens``: a prefill graph's token count
        (graphs.py), reached with one padding sequence."""
        upd_index, upd_block = [], []
        self.buf.update_rows(out, upd_index, upd_block)
        if is_uniform_decode(out):
            return self._prepare_decodes(out, pad_to, upd_index, upd_block)
        ids, positions, slots, cu, seq_lens, logits = [], [], [], [0], [], []
        t = 0
        for (req, n), sample in zip(out.scheduled, logits_rows(out)):
            kv = req.kv
            start = kv.cur_len
            toks = req.tokens(start, n)
            ids += toks if len(toks) == n else toks + [0]    # its newest token still on the device: filled below
            positions += range(start, start + n)
            slots += kv.slot_indices[start:start + n]
            t += n
            cu.append(t)
            seq_lens.append(start + n)
            logits.extend(range(t - sample, t))      # the chunk's last ``sample`` tokens (True: its last one)
        rows = self.buf.rows_for(out.scheduled)
        if pad_to is not None and pad_to > len(seq_lens):   # a graph replay of a uniform step of q tokens a
            q, k = t // len(seq_lens), pad_to - len(seq_lens)   # sequence: padding ones at 0..q-1, PAD slots
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
        """The step's one copy, then the ids still on the device put in place (async scheduling, step.py)."""
        self.buf.upload(lay)
        if self.in_flight:
            fill_in_flight(self.buf.view(lay.ids, torch.int64, lay.T), out.scheduled, self.in_flight)

    def meta(self, lay: Layout, max_seqlen_q: int, max_seqlen_kv: int, num_splits: int):
        return self.buf.meta(lay, self.block_size, max_seqlen_q, max_seqlen_kv, num_splits,
                             pdl=getattr(self.ops, "pdl", False))      # FusedOps decides (TorchOps: never)

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
        return split_prompt_rows(RunnerOutput(*self.forward(lay, max_q, max_kv, splits)), out)

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


def fill_in_flight(input_ids, scheduled, in_flight: dict) -> None:
    """Async scheduling (step.py): a decoding request's newest token may still be on the device,
    sampled by the step before and not yet seen by the host (``prepare`` put a 0 in its place).
    Copy each from the sampler's output into its place in this step's ``input_ids``, on the
    device, in stream order: the forward launched next reads it, and the host never waits."""
    dst, src, t, ids = [], [], 0, None
    for req, n in scheduled:
        got = in_flight.get(req.request_id)
        if got is not None:
            ids, i = got
            dst.append(t + n - 1)                             # its newest token ends its chunk
            src.append(i)
        t += n
    if not dst:
        return
    if dst == src and dst[-1] == len(dst) - 1:                # the usual decode step: same rows, same order
        input_ids[:len(dst)].copy_(ids[:len(dst)])
    else:
        idx = to_device([dst, src], torch.int64, input_ids.device)   # pinned: the host does not wait
        input_ids[idx[0]] = ids[idx[1]]
