"""A random paged batch for the kernel tests and benchmarks (not used by the engine)."""
from __future__ import annotations

import math

import torch


def make_paged_batch(q_lens, kv_lens, H_q, H_kv, D, block_size, dtype, device, *, seed=0, spare_blocks=3):
    """Random paged batch for tests and benchmarks: shuffled (non-contiguous) block tables whose
    padding entries hold out-of-range ids, and NaN in every cache slot no sequence uses.
    Returns (q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table)."""
    torch.manual_seed(seed)
    n_used = [math.ceil(kv / block_size) for kv in kv_lens]
    num_blocks = sum(n_used) + spare_blocks
    perm = torch.randperm(num_blocks).to(torch.int32)                     # shuffled physical ids
    table = torch.full((len(kv_lens), max(n_used) + 2), num_blocks + 7, dtype=torch.int32)  # [S, max_blocks]
    slots = []
    for s, (start, n, kv) in enumerate(zip(torch.tensor([0] + n_used).cumsum(0).tolist(), n_used, kv_lens)):
        table[s, :n] = perm[start:start + n]
        j = torch.arange(kv)                                              # logical key positions
        slots.append(table[s, j // block_size].long() * block_size + j % block_size)
    slots = torch.cat(slots).to(device)                                   # [sum(kv_lens)] flat slot ids
    k_cache = torch.full((num_blocks, block_size, H_kv, D), float("nan"), dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    k_cache.view(-1, H_kv, D)[slots] = torch.randn(len(slots), H_kv, D, device=device).to(dtype)
    v_cache.view(-1, H_kv, D)[slots] = torch.randn(len(slots), H_kv, D, device=device).to(dtype)
    q = torch.randn(sum(q_lens), H_q, D, device=device).to(dtype)        # [T, H_q, D]
    cu = torch.tensor([0] + list(q_lens)).cumsum(0).to(torch.int32)        # [S+1]
    kv = torch.tensor(kv_lens, dtype=torch.int32)                         # [S]
    return q, k_cache, v_cache, cu.to(device), kv.to(device), table.to(device)
