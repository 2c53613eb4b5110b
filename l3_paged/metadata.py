"""The per-step metadata of stage 3: three tensors that describe any batch.

    cu_seqlens_q [S+1] int32  prefix sum of query lengths, starts at 0
    seq_lens_kv  [S]   int32  K/V length of each sequence *after* this step's tokens are written
    block_table  [S, max_blocks] int32  each sequence's block list, right-padded with 0

| scenario                               | cu_seqlens_q      | seq_lens_kv      | block_table          |
|----------------------------------------|-------------------|------------------|----------------------|
| one prefill of N tokens                | [0, N]            | [N]              | [[b0, b1, ...]]      |
| one decode, L tokens cached            | [0, 1]            | [L+1]            | [[b0, b1, ...]]      |
| A decodes, B prefills a chunk of C     | [0, 1, 1+C]       | [L_A+1, L_B+C]   | [[A...], [B..., 0]]  |

Query token q (0-based) of sequence s attends to keys ``0 .. seq_lens_kv[s] - q_len[s] + q`` of
sequence s only. :func:`build_meta` makes these from a list of ``(request, new tokens)`` pairs;
a scheduler can call exactly this with the requests it picked for a step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedMeta:
    positions: torch.Tensor       # [T] int64   RoPE position of each new token
    slot_mapping: torch.Tensor    # [T] int64   flat slot (block_id * block_size + offset) to write
    cu_seqlens_q: torch.Tensor    # [S+1] int32
    seq_lens_kv: torch.Tensor     # [S] int32
    block_table: torch.Tensor     # [S, max_blocks] int32
    block_size: int
    max_seqlen_q: int             # host int: sizes the kernel grid without a device sync
    logits_indices: torch.Tensor  # [S'] int64  last new token of each sequence that samples (S' <= S)
                                  #             (or its last k tokens, where ``sample`` gives k)


def build_meta(batch, block_size: int, device, sample: list[bool] | None = None) -> PagedMeta:
    """``batch``: list of (Request, q_len). Each request already holds blocks for ``cur_len + q_len``
    tokens (``allocator.reserve``), and ``cur_len`` tokens of it are cached. ``sample`` says which
    sequences need next-token logits (default: all; a mid-prefill chunk needs none); an int k asks
    for the logits of the sequence's last k new tokens (a prompt's own logprobs).

    Everything is assembled in Python lists (the scheduler's host-side view of the requests) and
    copied to the device once per tensor.
    """
    positions, slots, cu, kv_lens, rows = [], [], [0], [], []
    for req, q_len in batch:
        start, end = req.cur_len, req.cur_len + q_len
        positions += range(start, end)
        slots += req.slot_indices[start:end]
        cu.append(cu[-1] + q_len)
        kv_lens.append(end)
        rows.append(req.blocks[:-(-end // block_size)])
    width = max(len(r) for r in rows)
    table = [r + [0] * (width - len(r)) for r in rows]   # right-pad; padding is never read
    i32 = dict(device=device, dtype=torch.int32)
    i64 = dict(device=device, dtype=torch.int64)
    return PagedMeta(
        positions=torch.tensor(positions, **i64),
        slot_mapping=torch.tensor(slots, **i64),
        cu_seqlens_q=torch.tensor(cu, **i32),
        seq_lens_kv=torch.tensor(kv_lens, **i32),
        block_table=torch.tensor(table, **i32),
        block_size=block_size,
        max_seqlen_q=max(q for _, q in batch),
        logits_indices=torch.tensor([i for s, c in enumerate(cu[1:]) for i in range(c - (1 if sample is None else
                                                                                          int(sample[s])), c)], **i64),
    )
