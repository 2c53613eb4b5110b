"""Tile sizes for the paged attention kernel (``attention_triton.py``), chosen from host ints only."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from plumbing.runtime import INTERPRET  # noqa: F401  (import before triton: picks GPU or interpreter)

import triton


@dataclass(frozen=True)
class KernelConfig:
    block_q: int      # query tokens per program; the tile has block_q * G_PAD rows
    block_n: int      # keys per inner-loop step (independent of the cache's block_size)
    num_warps: int
    num_stages: int   # software-pipelining depth of the K/V loads


def pick_config(max_seqlen_q: int, num_tokens: int, num_seqs: int, g_pad: int, d_pad: int,
                dtype: torch.dtype) -> KernelConfig:
    """Tile sizes per case, from host ints only. Measured on H200, Qwen3-8B shape (H_q 32,
    H_kv 8, D 128, bf16); docs/benchmarks.md has the sweep.

    * decode (every query fits one 16-row tile): the work is streaming K/V, so the tile is the
      smallest tl.dot allows (16 rows = 16 // G_PAD tokens, only the first real) with 128-key
      steps: more bytes in flight per program. 2 stages: 3 costs registers and ran 30% slower.
    * mixed (query tokens fill less than half of the S * max_seqlen_q slots: mostly decodes plus
      a chunk): 64 rows, 64 keys, 4 warps; a prefill-sized tile wastes 7/8 of it on decodes.
    * prefill: two matmuls per key tile, so 128 rows (32 tokens x 4 heads) and 128 keys, 8 warps,
      3 stages. From 2048 query tokens on, 256 rows (each K/V tile re-used twice as much, 8%
      faster at 4096); at 1024 tokens they leave SMs idle (30% slower), hence the threshold.
    * head_dim 256: 64 x 32 tiles to fit registers (not tuned).
    * float32 dots run on CUDA cores (input_precision="ieee"): 16 x 16 tiles, the largest that
      do not spill registers at D = 128..256 (ptxas -v, sm_90).
    * the Triton interpreter (CPU): every program and every tl op is a NumPy call, so cost grows
      with the number of programs and key steps, not with tile size. One fixed 64-row x 128-key
      tile, whatever the batch: 2-4x faster than the GPU's float32 tiles on CPU (measured on the
      tiny models), and a sequence's result cannot depend on its batch neighbours through tiling.
    """
    min_q = max(1, 16 // g_pad)                          # tl.dot needs M >= 16 rows
    if INTERPRET:
        return KernelConfig(max(min_q, 64 // g_pad), block_n=128, num_warps=4, num_stages=2)

    def tokens(rows):                                    # query tokens per tile, no more than needed
        return max(min_q, min(triton.next_power_of_2(max_seqlen_q), max(1, rows // g_pad)))

    if dtype == torch.float32:
        return KernelConfig(min_q, block_n=16, num_warps=4, num_stages=2)
    if max_seqlen_q <= min_q:                                                        # decode
        return KernelConfig(min_q, block_n=64 if d_pad > 128 else 128, num_warps=4, num_stages=2)
    if d_pad > 128:
        return KernelConfig(tokens(64), block_n=32, num_warps=4, num_stages=2)
    if 2 * num_tokens < num_seqs * max_seqlen_q:                                     # mixed
        return KernelConfig(tokens(64), block_n=64, num_warps=4, num_stages=2)
    if max_seqlen_q >= 2048:                                                         # long prefill
        return KernelConfig(tokens(256), block_n=64, num_warps=8, num_stages=3)
    block_q = tokens(128)
    if block_q * g_pad < 128:                            # a few tokens: 4 warps; 128 keys would spill
        return KernelConfig(block_q, block_n=64, num_warps=4, num_stages=3)
    return KernelConfig(block_q, block_n=128, num_warps=8, num_stages=3)
