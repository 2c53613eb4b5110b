"""How fast can decode attention read its cache? The read floor of each layout, against SDPA.

    python -m benchmarks.decode_limits            # GPU: ~1 min; benchmarks/results/decode_limits/<gpu>.*
    python -m benchmarks.decode_limits --quick    # CPU: the read kernel checked, nothing timed

Issue 18 asks decode attention to reach SDPA, and issue 19 the e4m3 cache to be 1.7x faster than
the bf16 one. Both are claims about bytes. This script measures the fastest a Triton kernel reads
those bytes, with no attention math at all: ``_read_kernel`` walks the keys of each (sequence,
kv head, split) exactly as the decode kernels do (block table, then one [BLOCK_N, D] tile of K
and one of V per step) and only sums their bytes, on tensor cores. Three layouts of the same K/V:

* paged: the engine's cache, [num_blocks, 16, H_kv, D], shuffled block table (token-major: a
  block's 16 rows of one head lie 2 KB apart);
* paged, head-major: [num_blocks, H_kv, 16, D] (a block's rows of one head are one 4 KB run);
* dense: SDPA's [B, H_kv, T, D], one block per sequence (the same kernel, block size = T).

and, per shape, the engine's decode attention (its choice of splits and tiles, PDL where the GPU
has it) on the paged cache and on the same K/V held as one block per sequence (token-major, and
head-major with SDPA's strides: what paging costs the same kernel), and SDPA on the dense copy.
Then stage 9's e4m3 cache, read the same way: the bf16 kernel's time over the e4m3 read time is a
speed-up the bytes allow (at least: the read kernel is not tuned). Every kernel time is GPU time
from a CUDA graph with L2 flushed (timing.py). The read kernel is first checked against torch
(exact byte sums) on a small batch. This file holds the read kernel and its check;
decode_limits_run.py the shapes, the timings, the table and the plot.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.outputs import out_help


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help=out_help("decode_limits"))
    p.add_argument("--quick", action="store_true", help="only the check (CPU: the interpreter; nothing timed)")
    return p.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch  # noqa: E402

from plumbing.runtime import INTERPRET  # noqa: E402  (before triton: picks GPU or interpreter)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks.decode_limits_run import BS, plot, run, table  # noqa: E402
from benchmarks.outputs import output_stem  # noqa: E402
from l3_paged.paged_batch import make_paged_batch  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import wrote  # noqa: E402


@triton.jit(do_not_specialize=["num_splits"])
def _read_kernel(k_ptr, v_ptr, bt_ptr, kv_lens_ptr, out_ptr, num_splits, stride_b, stride_s, stride_h, stride_bt,
                 BLOCK_SIZE: tl.constexpr, BYTES: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (h, i, s): the keys of split i of sequence s (the decode kernels' chunks), kv head
    h, K and V rows as int8 bytes. Each tile goes where a decode kernel's key tile goes, into a
    tensor-core dot (here ones x tile^T, in int8: no conversion), so its loads take the same path
    (async copies into shared memory, pipelined). Writes, per key position t of a tile, the sum
    of the bytes of every K and V row it read at that position."""
    kv_head, split, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_len = tl.load(kv_lens_ptr + seq)
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    cols = tl.arange(0, BYTES)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    k_head, v_head = k_ptr + kv_head * stride_h, v_ptr + kv_head * stride_h
    ones = tl.full([16, BYTES], 1, tl.int8)
    acc = tl.zeros([16, BLOCK_N], tl.int32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        ok = n < hi
        blk = tl.load(bt_row + n // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        at = (blk * stride_b + (n % BLOCK_SIZE) * stride_s)[:, None] + cols[None, :]
        acc = tl.dot(ones, tl.trans(tl.load(k_head + at, mask=ok[:, None], other=0)), acc, out_dtype=tl.int32)
        acc = tl.dot(ones, tl.trans(tl.load(v_head + at, mask=ok[:, None], other=0)), acc, out_dtype=tl.int32)
    out = ((seq * tl.num_programs(0) + kv_head) * num_splits + split).to(tl.int64) * BLOCK_N
    tl.store(out_ptr + out + tl.arange(0, BLOCK_N), tl.sum(acc, 0) // 16)


def as_bytes(cache: torch.Tensor) -> torch.Tensor:
    """[.., D] of any dtype viewed as int8 bytes [.., D * itemsize] (no copy)."""
    return cache.contiguous().view(torch.int8)


def read(k, v, table, kv_lens, num_splits, block_n, head_major=False):
    """Launch ``_read_kernel``. k/v: the paged cache [nb, bs, H, D], or head-major [nb, H, bs, D]
    (SDPA's dense [B, H, T, D] is that with one block per sequence and table = arange(B)[:, None]).
    Returns the per-program byte sums [S, H, num_splits, block_n]."""
    kw, vw = as_bytes(k), as_bytes(v)
    S, H, W = kv_lens.shape[0], (kw.shape[1] if head_major else kw.shape[2]), kw.shape[-1]
    out = torch.empty(S, H, num_splits, block_n, dtype=torch.int32, device=k.device)
    tok, head = (2, 1) if head_major else (1, 2)                   # the token and head axes
    bs, sb, ss, sh = kw.shape[tok], kw.stride(0), kw.stride(tok), kw.stride(head)
    _read_kernel[(H, num_splits, S)](kw, vw, table, kv_lens, out, num_splits, sb, ss, sh, table.stride(0),
                                     BLOCK_SIZE=bs, BYTES=W, BLOCK_N=block_n, num_warps=4, num_stages=2)
    return out


def read_ref(k, v, table, kv_lens, num_splits, block_n):
    """The same sums from torch (paged token-major layout)."""
    kw, vw = as_bytes(k).long(), as_bytes(v).long()
    S, H = kv_lens.shape[0], kw.shape[2]
    bs = kw.shape[1]
    out = torch.zeros(S, H, num_splits, block_n, dtype=torch.long, device=k.device)
    for s, n_keys in enumerate(kv_lens.tolist()):
        chunk = -(-(-(-n_keys // num_splits)) // block_n) * block_n
        for i in range(num_splits):
            for t in range(block_n):            # key positions t, t + block_n, ... of the split
                first, end = i * chunk + t, min((i + 1) * chunk, n_keys)
                if first < end:
                    j = torch.arange(first, end, block_n, device=k.device)
                    blk, off = table[s, j // bs].long(), j % bs
                    out[s, :, i, t] = (kw[blk, off] + vw[blk, off]).sum((0, 2))
    return out.to(torch.int32)


def dense(c, table, kv_lens) -> torch.Tensor:
    """Paged c [nb, bs, H, D] as SDPA's dense [S, H, T, D] (T: the longest sequence; zeros past each)."""
    T, bs = int(kv_lens.max()), c.shape[1]
    out = torch.zeros(len(kv_lens), c.shape[2], T, c.shape[3], dtype=c.dtype, device=c.device)
    for s, n in enumerate(kv_lens.tolist()):
        j = torch.arange(n, device=c.device)
        out[s, :, :n] = c[table[s, j // bs].long(), j % bs].transpose(0, 1)
    return out


def check(device) -> bool:
    """The read kernel against torch on a small uneven batch, every layout (False on a mismatch)."""
    args = make_paged_batch([1] * 3, [100, 37, 300], 4, 2, 32, BS, torch.float16, device)
    _, k, v, _, kv_lens, table = args
    ids = torch.arange(3, device=device, dtype=torch.int32)[:, None]
    ok = True
    for splits in (1, 3):
        want = read_ref(k, v, table, kv_lens, splits, 32)
        got = read(k, v, table, kv_lens, splits, 32)
        hm = read(k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), table, kv_lens, splits, 32,
                  head_major=True)
        dn = read(dense(k, table, kv_lens), dense(v, table, kv_lens), ids, kv_lens, splits, 32, head_major=True)
        same = torch.equal(got, want) and torch.equal(hm, want) and torch.equal(dn, want)
        print(f"check read kernel, {splits} split(s): token-major, head-major and dense sums "
              f"{'equal torch' if same else 'DIFFER from torch: FAIL'}")
        ok &= same
    return ok


def main(argv=None) -> int:
    a = parse(argv)
    device = "cpu" if INTERPRET else "cuda"
    ok = check(device)
    if a.quick or device == "cpu":
        if device == "cpu" and not a.quick:
            print("no GPU: only the check ran (nothing to time under the interpreter)")
        return 0 if ok else 1
    if not ok:
        return 1
    t0 = time.perf_counter()
    result = run(read)
    stem = output_stem("decode_limits", a.out, a.quick, device)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(table(result) + "\n")
    plot(result, stem + ".png")
    print(table(result))
    print(wrote(stem + ".json", stem + ".md", stem + ".png") + f" in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
