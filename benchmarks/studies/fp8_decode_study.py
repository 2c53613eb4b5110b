"""Why the e4m3 decode kernel is not twice as fast as the bf16 one: a study with kernel variants.

    python -m benchmarks.studies.fp8_decode_study            # GPU, ~15 s on a fresh H200
    python -m benchmarks.studies.fp8_decode_study --quick    # CPU: every variant against the reference

An e4m3 cache halves the bytes a decode step streams, so a kernel that streams at the same
fraction of copy bandwidth would be 2x faster. On an H200 at 64 x 4,096 stage 9's kernel streams
63% of copy bandwidth where stage 7's bf16 kernel streams ~99% (docs/benchmarks.md, stage 9; the
copy counts reads and writes, so a pure read can pass 100%). This script times one decode
kernel written five ways, on one GPU in one run, to find which part of the e4m3 path holds it:

    bf16            the bf16 cache, the dots in bf16 (the peer; 64- and 128-key tiles)
    e4m3 -> fp16    the shipped kernel's method (codes converted to float16, one instruction per
                    two; two fp16 dots), written as one loop
    e4m3 dots       q and p cast to e4m3 and both dots handed e4m3 operands (on an H200, Triton
                    3.6 converts them to fp16 for the 16-row MMA anyway: see its PTX counts)
    V via registers as shipped, but V's tile is made a register tensor before its dot (a select),
                    so Triton does not feed the byte-wide tile to the dot from shared memory
    keys as rows    the dots swapped (s^T = K q^T, acc^T = V^T p^T): the key tile is the MMA's M
    fp8 MMA: ...    e4m3 fed to fp8 wgmma without conversion, for q K^T, p V or both, q and p
                    rounded to e4m3 as hi + lo (fp8_mma_variants.py), and its fp16 control

and the shipped kernel on a cache laid out head-major in memory ([block, head, token, D] strides
instead of [block, token, head, D]: each (block, head) one contiguous run). Every variant is the
same decode (one query token per sequence, per-tensor scales, no window), checked against stage
9's reference before it is timed (CUDA graph, L2 flushed). Per variant: microseconds, % of copy
bandwidth, registers, shared memory and counts of PTX instructions (byte loads from shared
memory, e4m3 conversions, ldmatrix, MMAs). ``--once shipped|bf16`` runs one shipped kernel 6 times
and exits, for ``ncu`` (docs/benchmarks.md gives the command). A GPU run writes
benchmarks/results/fp8_decode_study/<gpu>.{json,md,png}; --quick writes under out/.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("fp8_decode_study"))
    ap.add_argument("--quick", action="store_true", help="CPU: small shapes, every variant against the reference")
    ap.add_argument("--once", choices=("shipped", "bf16"), help="run that shipped kernel 6 times at 64 x 4096 (ncu)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])

import torch  # noqa: E402

import plumbing.runtime  # noqa: E402,F401  (before triton: picks GPU or interpreter; stage packages import lazily)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks.bench_common import bench_device, ceilings, free, timed  # noqa: E402
from benchmarks.outputs import output_stem  # noqa: E402
from benchmarks.studies.fp8_mma_variants import MMA_VARIANTS, mma_variant  # noqa: E402
from l3_paged.paged_batch import make_paged_batch  # noqa: E402
from l7_fast.attention_split import paged_attention_split  # noqa: E402
from l9_fp8_kv import fp8_attention_ref, paged_attention_fp8_split  # noqa: E402
from l9_fp8_kv.attention import quantize_batch  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import pyplot, wrote  # noqa: E402

LOG2E = 1.4426950408889634
BF16, CONVERT, E4M3_DOTS, V_REGISTERS = 0, 1, 2, 3          # the modes of _study_kernel
VARIANTS = [("bf16", BF16, 64), ("bf16", BF16, 128), ("e4m3 -> fp16", CONVERT, 128),
            ("e4m3 dots", E4M3_DOTS, 128), ("V via registers", V_REGISTERS, 128), ("keys as rows", None, 128)] \
    + MMA_VARIANTS                                           # fp8_mma_variants.py: e4m3 into wgmma


@triton.jit
def _study_kernel(q_ptr, kc, vc, o_ptr, kv_lens_ptr, bt_ptr, qk_scale, stride_qt, stride_qh, stride_cb, stride_cs,
                  stride_ch, stride_bt, BS: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                  BLOCK_N: tl.constexpr, MODE: tl.constexpr):
    """One decode query per sequence, one program per (KV head, sequence); rows = the G query heads."""
    kvh, seq = tl.program_id(0), tl.program_id(1)
    kv_len = tl.load(kv_lens_ptr + seq)
    rows = tl.arange(0, ROWS)
    head = kvh * G + rows
    d = tl.arange(0, D)
    io = (rows < G)[:, None]
    q = tl.load(q_ptr + seq * stride_qt + head[:, None] * stride_qh + d[None, :], mask=io, other=0.0)
    dt: tl.constexpr = kc.dtype.element_ty if MODE == 0 else tl.float8e4nv if MODE == 2 else tl.float16
    q = q.to(dt)
    kc, vc, bt = kc + kvh * stride_ch, vc + kvh * stride_ch, bt_ptr + seq * stride_bt
    acc = tl.zeros([ROWS, D], tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        live = j < kv_len
        at = (tl.load(bt + j // BS, mask=live, other=0).to(tl.int64) * stride_cb + (j % BS) * stride_cs)[:, None] \
            + d[None, :]
        s = tl.dot(q, tl.trans(tl.load(kc + at, mask=live[:, None], other=0.0).to(dt)))
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc + at, mask=live[:, None], other=0.0).to(dt)
        if MODE == 3:
            v = tl.where(live[:, None], v, 0.0)                  # a register tensor: no byte-wise shared loads
        acc = tl.dot(p.to(dt), v, acc * alpha[:, None])
        m_i = m_new
    tl.store(o_ptr + seq * stride_qt + head[:, None] * stride_qh + d[None, :],
             (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=io)


@triton.jit
def _keys_as_rows_kernel(q_ptr, kc, vc, o_ptr, kv_lens_ptr, bt_ptr, qk_scale, stride_qt, stride_qh, stride_cb,
                         stride_cs, stride_ch, stride_bt, BS: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr,
                         D: tl.constexpr, BLOCK_N: tl.constexpr):
    """The same decode with the dots swapped: s^T = K q^T [BLOCK_N, ROWS], acc^T = V^T p^T [D, ROWS]."""
    kvh, seq = tl.program_id(0), tl.program_id(1)
    kv_len = tl.load(kv_lens_ptr + seq)
    rows = tl.arange(0, ROWS)
    head = kvh * G + rows
    d = tl.arange(0, D)
    io = (rows < G)[None, :]
    q_t = tl.load(q_ptr + seq * stride_qt + head[None, :] * stride_qh + d[:, None], mask=io, other=0.0).to(tl.float16)
    kc, vc, bt = kc + kvh * stride_ch, vc + kvh * stride_ch, bt_ptr + seq * stride_bt
    acc_t = tl.zeros([D, ROWS], tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        live = j < kv_len
        at = (tl.load(bt + j // BS, mask=live, other=0).to(tl.int64) * stride_cb + (j % BS) * stride_cs)[:, None] \
            + d[None, :]
        s_t = tl.dot(tl.load(kc + at, mask=live[:, None], other=0.0).to(tl.float16), q_t)
        s_t = tl.where(live[:, None], s_t, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s_t, 0) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p_t = tl.exp2(s_t * qk_scale - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p_t, 0)
        v = tl.load(vc + at, mask=live[:, None], other=0.0).to(tl.float16)
        acc_t = tl.dot(tl.trans(v), p_t.to(tl.float16), acc_t * alpha[None, :])
        m_i = m_new
    tl.store(o_ptr + seq * stride_qt + head[None, :] * stride_qh + d[:, None],
             (acc_t / l_i[None, :]).to(o_ptr.dtype.element_ty), mask=io)


def study(mode, q, kc, vc, lens, table, block_n, scale=1.0):
    """One variant's output (and its compiled kernel, for the PTX counts). ``scale``: the per-tensor
    k_scale * v_scale of an e4m3 cache (both 1.0 here, as quantize_batch makes them)."""
    S, H_q, D = q.shape
    H_kv = kc.shape[2]
    out = torch.empty_like(q)
    args = (q, kc, vc, out, lens, table, D ** -0.5 * LOG2E * scale, q.stride(0), q.stride(1), kc.stride(0),
            kc.stride(1), kc.stride(2), table.stride(0))
    meta = dict(BS=kc.shape[1], G=H_q // H_kv, ROWS=max(16, triton.next_power_of_2(H_q // H_kv)), D=D, BLOCK_N=block_n,
                num_warps=4, num_stages=2)
    if isinstance(mode, tuple):
        return mma_variant(*mode, q, kc, vc, lens, table, block_n)
    if mode is None:
        compiled = _keys_as_rows_kernel[(H_kv, S)](*args, **meta)
    else:
        compiled = _study_kernel[(H_kv, S)](*args, MODE=mode, **meta)
    return out, compiled


def head_major(t):
    """The same logical [blocks, tokens, heads, D] cache, laid out [blocks, heads, tokens, D] in memory."""
    return t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


PTX_OPS = ("ld.shared.b8", "cvt.rn.f16x2.e4m3x2", "ldmatrix", "mma", "wgmma", "cp.async")


def ptx_counts(compiled) -> dict:
    try:
        ptx = compiled.asm["ptx"]
    except (AttributeError, KeyError):
        return {}
    ops = collections.Counter(m.group(1) for m in re.finditer(r"\n\s*(?:@%p\d+\s+)?([a-z][a-z0-9_.]*)", ptx))
    return {k: sum(n for op, n in ops.items() if op.startswith(k) and (k != "mma" or op.startswith("mma.")))
            for k in PTX_OPS}


def shape_rows(device, B, ctx, heads, dt, bw) -> list[dict]:
    """Every case at one shape: checked against its reference, then timed."""
    H_Q, H_KV, D, BS = heads
    base = make_paged_batch([1] * B, [ctx] * B, H_Q, H_KV, D, BS, dt, device, spare_blocks=0)
    fp8 = quantize_batch(base, False)
    q, kc, vc, _, _, _, lens, table = fp8
    ref = fp8_attention_ref(*fp8, window=None).float()
    ref16 = paged_attention_split(*base, max_seqlen_q=1, max_seqlen_kv=ctx, num_splits=1).float()
    hnd = list(fp8)
    hnd[1], hnd[2] = head_major(fp8[1]), head_major(fp8[2])
    shipped = {"shipped e4m3": lambda: paged_attention_fp8_split(*fp8, max_seqlen_q=1, num_splits=1),
               "shipped e4m3, head-major cache": lambda: paged_attention_fp8_split(*hnd, max_seqlen_q=1, num_splits=1),
               "shipped bf16": lambda: paged_attention_split(*base, max_seqlen_q=1, max_seqlen_kv=ctx, num_splits=1)}
    rows = []
    for label, mode, bn in VARIANTS + [(k, "shipped", None) for k in shipped]:
        cache16 = mode == BF16 or label == "shipped bf16"
        if mode == "shipped":
            fn = shipped[label]
            out, compiled = fn(), None
        else:
            kv = (base[1], base[2]) if cache16 else (kc, vc)
            fn = lambda: study(mode, q, *kv, lens, table, bn)[0]  # noqa: E731
            out, compiled = study(mode, q, *kv, lens, table, bn)      # the output checked, the kernel's PTX counted
        err = (out.float() - (ref16 if cache16 else ref)).abs().max().item()
        tol = 2e-2 if mode == E4M3_DOTS else (2e-2 if dt == torch.bfloat16 else 1e-4) if cache16 else 5e-3
        #     e4m3 dots round q and p to 3 bits; a bf16 cache's dots round to bf16 (the CPU runs float32)
        ok = err <= tol if device == "cuda" or mode != E4M3_DOTS else True   # interpreter: its e4m3 casts are off
        us = timed(device, fn) * 1e3
        nb = 2 * B * ctx * H_KV * D * (2 if cache16 else 1)
        row = dict(B=B, ctx=ctx, variant=label, block_n=bn, us=us, err=err, ok=ok,
                   copy_frac=nb / us / 1e3 / bw if bw else None)
        if compiled is not None and device == "cuda":
            row.update(regs=compiled.n_regs, smem=compiled.metadata.shared, ptx=ptx_counts(compiled))
        rows.append(row)
        frac = f"{row['copy_frac']:.0%} of copy" if bw else "CPU"
        print(f"  {B} x {ctx:>5}  {label:<32} {bn or '':>4}  {us:9.1f} us  {frac:>12}  err {err:.2g}"
              f"{'' if ok else '  WRONG'}  {row.get('regs', '')} {row.get('ptx', '')}", flush=True)
    return rows


def report(stem, name, rows, shapes, res) -> None:
    with open(stem + ".json", "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# e4m3 decode study ({name})", "", "| B x ctx | variant | keys/tile | us | % of copy | regs | PTX |",
          "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        frac = "" if r["copy_frac"] is None else f"{r['copy_frac']:.0%}"
        md.append(f"| {r['B']} x {r['ctx']} | {r['variant']} | {r['block_n'] or ''} | {r['us']:.1f} | {frac} | "
                  f"{r.get('regs', '')} | {r.get('ptx', '')} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    plt = pyplot()
    if plt is None or res["copy_gbs"] is None:
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, (B, ctx) in enumerate(shapes):
        sub = [r for r in rows if (r["B"], r["ctx"]) == (B, ctx)]
        ax.barh([k + i * 0.4 for k in range(len(sub))], [r["copy_frac"] * 100 for r in sub], height=0.4,
                label=f"{B} x {ctx}")
    ax.set_yticks([k + 0.2 for k in range(len(sub))], [f"{r['variant']} {r['block_n'] or ''}" for r in sub])
    ax.set_xlabel("% of copy bandwidth (bytes the variant must read / time)")
    ax.set_title(f"e4m3 decode variants, {name}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)


def main(argv=None):
    args = parse(argv if argv is not None else sys.argv[1:])
    device = bench_device(args.quick)
    heads = (8, 2, 32, 16) if args.quick else (32, 8, 128, 16)
    shapes = [(2, 70)] if args.quick else [(64, 4096), (32, 8192)]
    dt = torch.float32 if args.quick else torch.bfloat16
    if args.once:
        base = make_paged_batch([1] * 64, [4096] * 64, *heads, dt, device, spare_blocks=0)
        fp8 = quantize_batch(base, False)
        for _ in range(6):
            if args.once == "shipped":
                paged_attention_fp8_split(*fp8, max_seqlen_q=1, num_splits=1)
            else:
                paged_attention_split(*base, max_seqlen_q=1, max_seqlen_kv=4096, num_splits=1)
        torch.cuda.synchronize()
        return 0
    t00 = time.perf_counter()
    bw, _ = ceilings(device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    print(f"{name}; copy bandwidth {f'{bw:.0f} GB/s' if bw else 'not measured (CPU)'}; H_q, H_kv, D, block = {heads}; "
          f"{dt}", flush=True)
    rows = []
    for B, ctx in shapes:
        rows += shape_rows(device, B, ctx, heads, dt, bw)
        free()
    bad = sum(not r["ok"] for r in rows)
    stem = output_stem("fp8_decode_study", args.out, args.quick, device)
    report(stem, name, rows, shapes, dict(device=name, copy_gbs=bw, dtype=str(dt), heads=list(heads), rows=rows,
                                          seconds=time.perf_counter() - t00))
    print(f"{len(rows)} cases, {bad} wrong; {time.perf_counter() - t00:.0f} s; "
          + wrote(stem + ".json", stem + ".md", stem + ".png"))
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
