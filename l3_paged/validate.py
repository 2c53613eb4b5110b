"""Input checks for paged attention (shared by the reference and the Triton kernel).

Two levels, because they cost different things:

* :func:`check_paged_layout` reads only shapes, strides, dtypes and devices. These live on the
  host, so it costs nothing on the GPU and runs before every kernel launch.
* :func:`validate_paged_inputs` also reads the *values* of the metadata (``cu_seqlens_q``,
  ``seq_lens_kv``, ``block_table``). On a GPU that means device->host copies, each one a
  synchronisation that stalls the launch queue. So it runs in tests and in the smoke scripts'
  ``--check`` mode, and is off in the hot path. A bad block id that slips past it is an
  out-of-bounds read inside the kernel (garbage output or an illegal-address crash).

Every failure raises :class:`plumbing.errors.UserError` naming the problem and the fix.
"""
from __future__ import annotations

import torch

from plumbing.errors import UserError

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


def check_paged_layout(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table) -> None:
    """Shapes, dtypes, strides, devices. Host-only: no device sync."""
    _need(q.dim() == 3, f"q must be [T, H_q, D] (token-flat), got shape {tuple(q.shape)}")
    _need(k_cache.dim() == 4,
          f"k_cache must be [num_blocks, block_size, H_kv, D], got shape {tuple(k_cache.shape)}; "
          "view the token-flat pool as .view(num_blocks, block_size, H_kv, D)")
    _need(v_cache.shape == k_cache.shape,
          f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    T, H_q, D = q.shape
    num_blocks, block_size, H_kv, D_kv = k_cache.shape
    _need(D == D_kv, f"head_dim mismatch: q has D={D}, k_cache has D={D_kv}")
    _need(H_kv > 0 and H_q % H_kv == 0,
          f"H_q={H_q} must be a multiple of H_kv={H_kv} (grouped-query attention)")
    _need(block_size > 0 and num_blocks > 0, f"k_cache has an empty dim: {tuple(k_cache.shape)}")

    _need(q.dtype in FLOAT_DTYPES, f"q dtype {q.dtype} unsupported: use float32, float16 or bfloat16")
    _need(k_cache.dtype == q.dtype and v_cache.dtype == q.dtype,
          f"dtype mismatch: q {q.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}; "
          "cast them to one dtype")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("seq_lens_kv", seq_lens_kv),
                    ("block_table", block_table)):
        _need(t.dtype == torch.int32,
              f"{name} must be int32, got {t.dtype}: call .to(torch.int32) "
              "(kernels index with 32-bit ints; int64 metadata is a common mistake)")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("cu_seqlens_q", cu_seqlens_q), ("seq_lens_kv", seq_lens_kv),
                    ("block_table", block_table)):
        _need(t.device == q.device, f"{name} is on {t.device} but q is on {q.device}: move it with .to()")

    _need(cu_seqlens_q.dim() == 1 and seq_lens_kv.dim() == 1 and block_table.dim() == 2,
          "metadata ranks: cu_seqlens_q [S+1], seq_lens_kv [S], block_table [S, max_blocks]; got "
          f"{tuple(cu_seqlens_q.shape)}, {tuple(seq_lens_kv.shape)}, {tuple(block_table.shape)}")
    S = seq_lens_kv.shape[0]
    _need(cu_seqlens_q.shape[0] == S + 1,
          f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries but seq_lens_kv has S={S}: need S+1")
    _need(block_table.shape[0] == S,
          f"block_table has {block_table.shape[0]} rows but seq_lens_kv has S={S}: one row per sequence")

    # The kernel takes any strides but needs the innermost dim packed (coalesced D loads).
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table)):
        _need(t.stride(-1) == 1,
              f"{name} is not contiguous in its last dim (stride {t.stride(-1)}): call .contiguous()")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("seq_lens_kv", seq_lens_kv)):
        _need(t.is_contiguous(), f"{name} is not contiguous: call .contiguous()")


def validate_paged_inputs(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table,
                          *, max_seqlen_q: int | None = None) -> None:
    """Full check of a paged-attention call, metadata values included.

    Cost: besides the host-only layout checks, it copies ``cu_seqlens_q``, ``seq_lens_kv`` and
    ``block_table`` to the host (three device->host syncs on a GPU, O(S * max_blocks) work).
    Use it in tests and ``--check`` modes, not per layer in the hot path.
    """
    check_paged_layout(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table)
    T = q.shape[0]
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    cu = cu_seqlens_q.tolist()            # device->host sync
    kv_lens = seq_lens_kv.tolist()        # device->host sync
    table = block_table.cpu()             # device->host sync  [S, max_blocks]

    _need(cu[0] == 0, f"cu_seqlens_q must start at 0, got {cu[0]}")
    for s in range(len(kv_lens)):
        _need(cu[s + 1] >= cu[s],
              f"cu_seqlens_q must be non-decreasing (a prefix sum of query lengths), "
              f"but cu_seqlens_q[{s + 1}]={cu[s + 1]} < cu_seqlens_q[{s}]={cu[s]}")
    _need(cu[-1] == T, f"cu_seqlens_q[-1]={cu[-1]} must equal the number of query tokens T={T}")

    for s, kv_len in enumerate(kv_lens):
        q_len = cu[s + 1] - cu[s]
        _need(kv_len >= q_len,
              f"seq_lens_kv[{s}]={kv_len} is smaller than its query length {q_len}: seq_lens_kv "
              "counts the whole KV length including the new tokens (write K/V first, then attend)")
        if max_seqlen_q is not None:
            _need(q_len <= max_seqlen_q,
                  f"max_seqlen_q={max_seqlen_q} is smaller than sequence {s}'s query length {q_len}: "
                  "pass the longest query length (the kernel grid is sized from it)")
        n_used = -(-kv_len // block_size)                      # ceil(kv_len / block_size)
        _need(n_used <= table.shape[1],
              f"block_table has {table.shape[1]} columns but sequence {s} (kv_len={kv_len}, "
              f"block_size={block_size}) needs {n_used} blocks: widen the table")
        used = table[s, :n_used]
        bad = (used < 0) | (used >= num_blocks)
        if bool(bad.any()):
            j = int(bad.nonzero()[0, 0])
            raise UserError(
                f"block id out of range: block_table[{s}, {j}]={int(used[j])} but the cache has "
                f"{num_blocks} blocks (valid ids 0..{num_blocks - 1}); check the allocator")
