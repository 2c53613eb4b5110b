"""Stage 7's runner, sending one block table (and one slot mapping) per KV cache group.

Stage 7 keeps one block-table row per running request on the device and sends only new entries.
With G groups (groups.py) a request has G block lists, so it gets G rows, one per handle: group
0's handle is ``req.kv`` and group g's is named ``(request_id, g)`` (kv_manager.py). Stage 7's
``StepInputs`` already gives a row to any handle that appears in ``new_blocks``, so the table only
needs G times as many rows. What each step adds:

    step inputs (stage 7)    ids | positions | slots | ... | rows       group 0, one pinned copy
    group inputs (here)      slots[g][:T]  rows[g][:S]  for g = 1 .. G-1 a second pinned copy
    meta (GroupMeta)         group_slots[g], group_tables[g] = table.index_select(0, rows[g])

The group buffers have fixed addresses and pad values past the step's rows, so a CUDA graph
captured for B decode rows reads them as it reads stage 7's. A model with one group (every
layer alike) adds nothing: this runner is then stage 7's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from l7_fast.cache import FastMeta
from l7_fast.runner import FastRunner
from l7_fast.step_inputs import StepInputs


@dataclass
class GroupMeta(FastMeta):
    group_slots: list = field(default_factory=list)      # per group: [T] int64 (group 0: slot_mapping)
    group_tables: list = field(default_factory=list)     # per group: [S, W] int32 (group 0: block_table)


class GroupedRunner(FastRunner):
    def __init__(self, model, config, ops, *, num_groups: int, **kw):
        super().__init__(model, config, ops, **kw)
        self.num_groups = G = num_groups
        if G == 1:
            return
        width = -(-config.max_model_len // config.block_size)
        self.buf = StepInputs(config.max_num_batched_tokens, config.max_num_seqs, G * config.max_num_seqs + 1,
                              width, self.cache.pad_block, self.device)     # a row per (request, group)
        T, S, pin = config.max_num_batched_tokens, config.max_num_seqs, self.device.type == "cuda"
        self.host_slots = torch.full((G - 1, T), self.cache.pad_slot, dtype=torch.int64, pin_memory=pin)
        self.host_rows = torch.full((G - 1, S), self.buf.pad_row, dtype=torch.int32, pin_memory=pin)
        self.slots_np, self.rows_np = self.host_slots.numpy(), self.host_rows.numpy()   # filled in place
        self.dev_slots, self.dev_rows = self.host_slots.to(self.device), self.host_rows.to(self.device)
        self.group_copied = torch.cuda.Event() if pin else None

    def prepare(self, out, pad_to: int | None = None, pad_tokens: int | None = None):
        if self.num_groups == 1:
            return super().prepare(out, pad_to, pad_tokens)
        self._release_groups(out)
        lay, max_kv = super().prepare(out, pad_to, pad_tokens)   # stage 7's inputs; gives group handles their rows
        self._fill_groups(out, lay)
        return lay, max_kv

    def _release_groups(self, out) -> None:
        for rid in list(out.finished_ids) + [req.request_id for req in out.preempted]:
            for g in range(1, self.num_groups):
                self.buf.release((rid, g))

    def _fill_groups(self, out, lay) -> None:
        """Groups 1..G-1: each scheduled token's slot and each sequence's row; padding past them."""
        if self.group_copied is not None:
            self.group_copied.synchronize()          # the last step's copy has left the host buffers
        rows = self.buf.rows
        for g in range(1, self.num_groups):
            slots, seq_rows = [], []
            for req, n in out.scheduled:
                row, handle, _ = rows[(req.request_id, g)]
                start = req.kv.cur_len
                slots += handle.slot_indices[start:start + n]
                seq_rows.append(row)
            self.slots_np[g - 1, :len(slots)] = slots              # numpy converts the list: no tensor per step
            self.slots_np[g - 1, len(slots):lay.T] = self.cache.pad_slot
            self.rows_np[g - 1, :len(seq_rows)] = seq_rows
            self.rows_np[g - 1, len(seq_rows):lay.S] = self.buf.pad_row
        self.dev_slots[:, :lay.T].copy_(self.host_slots[:, :lay.T], non_blocking=True)
        self.dev_rows[:, :lay.S].copy_(self.host_rows[:, :lay.S], non_blocking=True)
        if self.group_copied is not None:
            self.group_copied.record()

    def meta(self, lay, max_seqlen_q: int, max_seqlen_kv: int, num_splits: int):
        input_ids, meta = super().meta(lay, max_seqlen_q, max_seqlen_kv, num_splits)
        tables = [meta.block_table] + [self.buf.table.index_select(0, self.dev_rows[g, :lay.S])
                                       for g in range(self.num_groups - 1)]
        slots = [meta.slot_mapping] + [self.dev_slots[g, :lay.T] for g in range(self.num_groups - 1)]
        return input_ids, GroupMeta(**vars(meta), group_slots=slots, group_tables=tables)
