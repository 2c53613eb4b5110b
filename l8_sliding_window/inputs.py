"""Stage 7's step inputs, with one block table (and one slot mapping) per KV cache group.

Stage 7 keeps one block-table row per running request on the device and sends only new entries
(l7_fast/step_inputs.py). With G groups (groups.py) a request has G block lists, so it gets G
rows, one per handle: group 0's handle is ``req.kv`` and group g's is named ``(request_id, g)``
(kv_coordinator.py). Stage 7's inputs already give a row to any handle that appears in
``new_blocks``, so the table only needs G times as many rows. What each step adds:

    step inputs (stage 7)    ids | positions | slots | ... | rows       group 0, one pinned copy
    group inputs (here)      slots[g][:T]  rows[g][:S]  for g = 1 .. G-1 a second pinned copy
    meta (GroupMeta)         group_slots[g], group_tables[g] = table.index_select(0, rows[g])

The group buffers have fixed addresses and pad values past the step's rows, so a CUDA graph
captured for B decode rows reads them as it reads stage 7's. ``GroupInputs`` holds stage 7's
inputs (``base``) and answers the runner's calls with them, adding the groups' part to three:
``update_rows`` (the groups' rows, given back or assigned), ``upload`` (the second copy) and
``meta``. A model with one group needs none of this: the assembler gives it stage 7's inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from l7_fast.runner import step_inputs
from l7_fast.step_inputs import FastMeta


@dataclass
class GroupMeta(FastMeta):
    group_slots: list = field(default_factory=list)      # per group: [T] int64 (group 0: slot_mapping)
    group_tables: list = field(default_factory=list)     # per group: [S, W] int32 (group 0: block_table)


class GroupInputs:
    def __init__(self, config, device, pad_block: int, pad_slot: int, num_groups: int):
        G, T, S = num_groups, config.max_num_batched_tokens, config.max_num_seqs
        self.base = step_inputs(config, device, pad_block, table_rows=G * S + 1)   # a row per (request, group)
        self.num_groups, self.pad_slot = G, pad_slot
        pin = torch.device(device).type == "cuda"
        self.host_slots = torch.full((G - 1, T), pad_slot, dtype=torch.int64, pin_memory=pin)
        self.host_rows = torch.full((G - 1, S), self.base.pad_row, dtype=torch.int32, pin_memory=pin)
        self.slots_np, self.rows_np = self.host_slots.numpy(), self.host_rows.numpy()   # filled in place
        self.dev_slots, self.dev_rows = self.host_slots.to(device), self.host_rows.to(device)
        self.copied = torch.cuda.Event() if pin else None
        self._step: list | None = None               # this step's (slots, rows) per group 1..G-1

    def __getattr__(self, name):                     # everything else: stage 7's inputs
        return getattr(self.base, name)

    def update_rows(self, out, upd_index: list, upd_block: list) -> None:
        for rid in list(out.finished_ids) + [req.request_id for req in out.preempted]:
            for g in range(1, self.num_groups):
                self.base.release((rid, g))
        self.base.update_rows(out, upd_index, upd_block)      # gives the group handles their rows too
        rows, self._step = self.base.rows, []
        for g in range(1, self.num_groups):
            slots, seq_rows = [], []
            for req, n in out.scheduled:
                row, handle, _ = rows[(req.request_id, g)]
                start = req.kv.cur_len
                slots += handle.slot_indices[start:start + n]
                seq_rows.append(row)
            self._step.append((slots, seq_rows))

    def upload(self, lay) -> None:
        """Stage 7's copy, then the groups' slots and rows (padding past the step's), in a second copy."""
        self.base.upload(lay)
        if self.copied is not None:
            self.copied.synchronize()                # the last step's copy has left the host buffers
        for g, (slots, rows) in enumerate(self._step or [([], [])] * (self.num_groups - 1)):
            self.slots_np[g, :len(slots)] = slots               # numpy converts the list: no tensor per step
            self.slots_np[g, len(slots):lay.T] = self.pad_slot
            self.rows_np[g, :len(rows)] = rows
            self.rows_np[g, len(rows):lay.S] = self.base.pad_row
        self._step = None
        self.dev_slots[:, :lay.T].copy_(self.host_slots[:, :lay.T], non_blocking=True)
        self.dev_rows[:, :lay.S].copy_(self.host_rows[:, :lay.S], non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def meta(self, lay, *args, **kw):
        input_ids, m = self.base.meta(lay, *args, **kw)
        tables = [m.block_table] + [self.base.table.index_select(0, self.dev_rows[g, :lay.S])
                                    for g in range(self.num_groups - 1)]
        slots = [m.slot_mapping] + [self.dev_slots[g, :lay.T] for g in range(self.num_groups - 1)]
        return input_ids, GroupMeta(**vars(m), group_slots=slots, group_tables=tables)
