"""Per-step inputs with one host-to-device copy, and a block table that only receives changes.

Stage 5 builds each step's metadata with seven ``torch.tensor(list, device=...)`` calls: seven
pageable copies, each a sync point, and the whole block table re-sent every step although a
decode step adds at most one block per request. Here:

    host   one pinned byte buffer, filled in place        (numpy views over pinned memory)
    copy   ONE non_blocking copy of the bytes used        host -> device, in stream order
    device views at fixed offsets: the layout depends only on (T, S, rows that sample), so a
           CUDA graph captured for B decode rows reads the same addresses at every replay

    bytes:  ids | positions | slots | logits_idx  (int64)   cu_seqlens | seq_lens | rows  (int32)
            then the block-table changes: flat index (int64) | block id (int32)

The block table lives on the device, one row per running request, ``[max_num_seqs + 1, W]`` int32
with W = max_model_len / block_size; the last row is the padding row (all PAD). A request keeps
its row while it runs; each step sends only the entries that are new since the last step
(``(row * W + col, block)`` pairs, scattered with one ``index_put_``), and the step's table is
``table.index_select(0, rows)``, which a graph can capture. Which entries are new, and which rows
return to the pool, the scheduler's output says (``update_rows``): a handle that gained blocks
(vLLM's ``new_block_ids``), a request that finished or was preempted (a preempted request comes
back with a new block list, and a new row).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch

from l3_paged.metadata import PagedMeta

I64, I32 = 8, 4
ALIGN = 16                                          # bytes: Triton's pointer specialization


@dataclass
class FastMeta(PagedMeta):
    """Stage 3's metadata, and the host ints the fast kernels choose by."""
    max_seqlen_kv: int = 0            # host int: bounds the context, for the split choice
    num_splits: int = 1               # host int: key splits per sequence in decode steps (1: stage 3's kernel)
    pdl: bool = False                 # the split kernels with programmatic dependent launch (pdl.py)


class Layout:
    """Byte offsets of each field for a step of T tokens, S sequences, L logits rows, U changes.
    Every field starts on a 16-byte boundary: Triton compiles a kernel once per alignment of each
    pointer argument (16 bytes or not), so fields at offsets that follow T's and S's parity would
    make the attention kernel compile up to four variants of each tile for the same step shapes."""

    def __init__(self, T: int, S: int, L: int, U: int):
        self.T, self.S, self.L, self.U = T, S, L, U
        def up(o):                                   # the next 16-byte boundary
            return -(-o // ALIGN) * ALIGN
        self.ids = 0
        self.positions = up(T * I64)
        self.slots = up(self.positions + T * I64)
        self.logits = up(self.slots + T * I64)
        self.cu = up(self.logits + L * I64)
        self.seq_lens = up(self.cu + (S + 1) * I32)
        self.rows = up(self.seq_lens + S * I32)
        self.upd_index = up(self.rows + S * I32)
        self.upd_block = up(self.upd_index + U * I64)
        o = up(self.upd_block + U * I32)
        self.nbytes = o


class StepInputs:
    def __init__(self, max_tokens: int, max_seqs: int, table_rows: int, table_width: int, pad_block: int,
                 device):
        self.device, self.width, self.pad_block = torch.device(device), table_width, pad_block
        n = Layout(max_tokens, max_seqs, max_tokens, max_seqs * table_width).nbytes   # a logits row per token at most
        self.host = torch.empty(n, dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        self.host_np = self.host.numpy()
        self.dev = torch.empty(n, dtype=torch.uint8, device=self.device)
        self.table = torch.full((table_rows, table_width), pad_block, dtype=torch.int32, device=self.device)
        self.pad_row = table_rows - 1
        self.free_rows = list(range(table_rows - 2, -1, -1))   # pop() hands out row 0 first
        self.rows: dict[str, list] = {}              # request id -> [row, block handle, blocks sent]
        self.copied = torch.cuda.Event() if self.device.type == "cuda" else None   # the last copy has left the host buffer

    # ---- host side ----------------------------------------------------------------------------
    def _put(self, offset: int, dtype, values) -> None:
        n = len(values)
        if not n:
            return
        if isinstance(values, list):                 # struct packs Python ints ~2x faster than numpy converts
            struct.pack_into(f"<{n}{'q' if dtype is np.int64 else 'i'}", self.host_np, offset, *values)
        else:
            self.host_np[offset:offset + n * np.dtype(dtype).itemsize].view(dtype)[:] = values

    def update_rows(self, out, upd_index: list, upd_block: list) -> None:
        """What changed since the last step, from the scheduler's output: the rows of finished and
        preempted requests go back to the pool; handles that gained blocks (admissions included)
        queue their new entries."""
        for rid in out.finished_ids:
            self.release(rid)
        for req in out.preempted:
            self.release(req.request_id)
        for kv in out.new_blocks:
            if not kv.freed:                         # (it grew, then was preempted in the same step)
                self.row_of(kv.req_id, kv, upd_index, upd_block)

    def row_of(self, rid: str, kv, upd_index: list, upd_block: list) -> int:
        """The request's table row; queues the blocks it gained since the last step."""
        ent = self.rows.get(rid)
        if ent is None or ent[1] is not kv:          # new, or a new block list after a preemption
            if ent is not None:
                self.free_rows.append(ent[0])
            if not self.free_rows:
                raise RuntimeError("no block-table row left: more running requests than max_num_seqs (a bug)")
            ent = self.rows[rid] = [self.free_rows.pop(), kv, 0]
        nb = len(kv.blocks)
        if nb > ent[2]:
            base = ent[0] * self.width
            upd_index.extend(range(base + ent[2], base + nb))
            upd_block.extend(kv.blocks[ent[2]:nb])
            ent[2] = nb
        return ent[0]

    def rows_for(self, scheduled) -> list[int]:
        """The table row of every scheduled request (each got one when its blocks were first sent)."""
        rows = self.rows
        try:
            return [rows[req.request_id][0] for req, _ in scheduled]
        except KeyError as e:
            raise RuntimeError(f"request {e.args[0]!r} has no block-table row: the scheduler never reported its "
                               "blocks in new_blocks (a bug)") from None

    def release(self, rid: str) -> None:
        ent = self.rows.pop(rid, None)
        if ent is not None:
            self.free_rows.append(ent[0])

    def write(self, lay: Layout, ids, positions, slots, logits, cu, seq_lens, rows, upd_index, upd_block):
        if self.copied is not None:   # a step that sampled nothing did not sync: the last copy may be queued
            self.copied.synchronize()                # (an event never recorded returns at once)
        put = self._put
        put(lay.ids, np.int64, ids)
        put(lay.positions, np.int64, positions)
        put(lay.slots, np.int64, slots)
        put(lay.logits, np.int64, logits)
        put(lay.cu, np.int32, cu)
        if seq_lens is None:                         # a decode step: K/V length = position + 1
            np.add(self.host_np[lay.positions:lay.positions + lay.T * I64].view(np.int64), 1,
                   out=self.host_np[lay.seq_lens:lay.seq_lens + lay.S * I32].view(np.int32), casting="unsafe")
        else:
            put(lay.seq_lens, np.int32, seq_lens)
        put(lay.rows, np.int32, rows)
        put(lay.upd_index, np.int64, upd_index)
        put(lay.upd_block, np.int32, upd_block)

    def pad_only(self, B: int, pad_slot: int, q: int = 1) -> Layout:
        """A step of B padding sequences of q tokens each (positions 0..q-1, PAD slots, the PAD row),
        every token sampling: a graph capture's inputs (q = 1: a decode step)."""
        T = B * q
        lay = Layout(T, B, T, 0)
        self.write(lay, [0] * T, list(range(q)) * B, [pad_slot] * T, list(range(T)), list(range(0, T + 1, q)),
                   [q] * B, [self.pad_row] * B, [], [])
        self.upload(lay)
        return lay

    def pad_prefill(self, T: int, pad_slot: int) -> Layout:
        """A prefill graph's capture inputs: T tokens as a (T - 1)-token and a 1-token padding
        sequence, one logits row at the end of each (a replay: the request's n tokens, then T - n)."""
        lay = Layout(T, 2, 2, 0)
        self.write(lay, [0] * T, list(range(T - 1)) + [0], [pad_slot] * T, [T - 2, T - 1], [0, T - 1, T],
                   [T - 1, 1], [self.pad_row] * 2, [], [])
        self.upload(lay)
        return lay

    # ---- device side --------------------------------------------------------------------------
    def upload(self, lay: Layout) -> None:
        """The step's one host-to-device copy, then the block-table changes (if any) scattered."""
        self.dev[:lay.nbytes].copy_(self.host[:lay.nbytes], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        if lay.U:
            idx = self.view(lay.upd_index, torch.int64, lay.U)
            self.table.view(-1).index_put_((idx,), self.view(lay.upd_block, torch.int32, lay.U))

    def view(self, offset: int, dtype, n: int) -> torch.Tensor:
        return self.dev[offset:offset + n * dtype.itemsize].view(dtype)

    def meta(self, lay: Layout, block_size: int, max_seqlen_q: int, max_seqlen_kv: int, num_splits: int,
             pdl: bool) -> tuple[torch.Tensor, FastMeta]:
        """The step's input ids and metadata: views of the copied bytes, and the step's block table
        gathered from its rows (one launch, which a graph captures)."""
        f = self.tensors(lay)
        return f["input_ids"], FastMeta(
            positions=f["positions"], slot_mapping=f["slot_mapping"], cu_seqlens_q=f["cu_seqlens_q"],
            seq_lens_kv=f["seq_lens_kv"], block_table=self.table.index_select(0, f["rows"]), block_size=block_size,
            max_seqlen_q=max_seqlen_q, logits_indices=f["logits_indices"], max_seqlen_kv=max_seqlen_kv,
            num_splits=num_splits, pdl=pdl)

    def tensors(self, lay: Layout) -> dict:
        """Device views of the step's fields (no copy, no launch)."""
        v = self.view
        return dict(input_ids=v(lay.ids, torch.int64, lay.T), positions=v(lay.positions, torch.int64, lay.T),
                    slot_mapping=v(lay.slots, torch.int64, lay.T), logits_indices=v(lay.logits, torch.int64, lay.L),
                    cu_seqlens_q=v(lay.cu, torch.int32, lay.S + 1), seq_lens_kv=v(lay.seq_lens, torch.int32, lay.S),
                    rows=v(lay.rows, torch.int32, lay.S))
