"""fp8_decode_study.py's fp8 tensor-core variants: e4m3 fed to wgmma, no conversion to fp16.

In the study's runs Triton 3.6 on Hopper made fp8 MMAs only where both operands were e4m3 and the
MMA's M a multiple of 64 (wgmma; its "e4m3 dots" at 16 query rows became fp16 ``mma.sync``). A
decode tile has G (<= 16) query rows and 64-128 keys, so the key or head dimension must be M:

    QK8   s^T = K q^T      M = keys, N = query rows, K = D: the key tile as stored, already K-major
    PV8   o^T = V^T p^T    M = D,    N = query rows, K = keys: V's tile must be keys-contiguous, so
                           Triton transposes the bytes of each [keys, D] tile (through shared memory)

The query and p are rounded to e4m3 twice, hi + lo (x = hi + lo / 16, two MMAs), so a bfloat16
query is exact (8 significant bits = 4 + 4) and p keeps about bfloat16's precision; q's scale is
a power of two per row (q / scale is exact) and p is scaled by 256 (it lies in [0, 1]). The
softmax runs on [rows, keys] either way. Under the interpreter the e4m3 casts are wrong (e4m3.py),
so the same rounding is done by hand and the dots run in float32: the CPU checks the method.

    python -m benchmarks.studies.fp8_mma_variants    # GPU: the variants with and without warp specialisation

A GPU run writes benchmarks/results/fp8_mma_variants/<gpu>.{json,md,png} (``--out DIR``: DIR/fp8_mma_variants.*).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description="fp8 MMA decode variants x warp specialisation (GPU)")
    ap.add_argument("--out", default=None, help=out_help("fp8_mma_variants"))
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])                         # a bad flag is refused before torch and triton load

import torch  # noqa: E402

import plumbing.runtime  # noqa: E402,F401  (before triton: picks GPU or interpreter; stage packages import lazily)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from plumbing.runtime import INTERPRET  # noqa: E402
from l9_fp8_kv.e4m3 import e4m3_decode, e4m3_encode  # noqa: E402
from l9_fp8_kv.write import kernel_view  # noqa: E402

LOG2E = 1.4426950408889634
MMA_VARIANTS = [("fp8 MMA: K q^T", (True, False), 128), ("fp8 MMA: V^T p^T", (False, True), 128),
                ("fp8 MMA: both", (True, True), 128), ("e4m3 -> fp16, row softmax (control)", (False, False), 128)]


@triton.jit
def _e4m3(x, BY_HAND: tl.constexpr):
    """x (float32, |x| <= 448) rounded to e4m3: the e4m3 tensor, or its value in float32 by hand."""
    if BY_HAND:
        return e4m3_decode(e4m3_encode(x))
    return x.to(tl.float8e4nv)


@triton.jit
def _hi_lo(x, BY_HAND: tl.constexpr):
    """x = hi + lo / 16, both e4m3: lo holds the 4 bits hi drops (|x - hi| <= 16 where |x| <= 448)."""
    hi = _e4m3(x, BY_HAND)
    return hi, _e4m3((x - hi.to(tl.float32)) * 16.0, BY_HAND)


@triton.jit
def _codes(ptrs, mask, BY_HAND: tl.constexpr):
    if BY_HAND:
        return e4m3_decode(tl.load(ptrs, mask=mask, other=0))
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _mma_kernel(q_ptr, kc, vc, o_ptr, kv_lens_ptr, bt_ptr, qk_scale, stride_qt, stride_qh, stride_cb, stride_cs,
                stride_ch, stride_bt, BS: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                BLOCK_N: tl.constexpr, QK8: tl.constexpr, PV8: tl.constexpr, BY_HAND: tl.constexpr,
                WS: tl.constexpr):
    """One decode query per sequence, one program per (KV head, sequence), per-tensor scales 1.0.
    WS: Triton's warp specialisation of the key loop (Hopper's autoWS; loads and MMAs in separate warps)."""
    kvh, seq = tl.program_id(0), tl.program_id(1)
    kv_len = tl.load(kv_lens_ptr + seq)
    rows = tl.arange(0, ROWS)
    head = kvh * G + rows
    d = tl.arange(0, D)
    ok = rows < G
    q = tl.load(q_ptr + seq * stride_qt + head[:, None] * stride_qh + d[None, :], mask=ok[:, None], other=0.0)
    q = q.to(tl.float32)
    amax = tl.max(tl.abs(q), 1)
    qs = tl.where(amax > 0, tl.exp2(tl.ceil(tl.log2(tl.maximum(amax, 1e-30) / 448.0))), 1.0)   # a power of two
    q_hi, q_lo = _hi_lo(q / qs[:, None], BY_HAND)
    q_hi_t, q_lo_t = tl.trans(q_hi), tl.trans(q_lo)                    # [D, ROWS]
    dot16: tl.constexpr = tl.float32 if BY_HAND else tl.float16
    q16 = q.to(dot16)
    qk = (qs if QK8 else tl.full([ROWS], 1.0, tl.float32)) * qk_scale
    kc, vc, bt = kc + kvh * stride_ch, vc + kvh * stride_ch, bt_ptr + seq * stride_bt
    if PV8:
        acc = tl.zeros([D, ROWS], tl.float32)                           # o^T, p scaled by 256
    else:
        acc = tl.zeros([ROWS, D], tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    for start in tl.range(0, kv_len, BLOCK_N, warp_specialize=WS):
        j = start + tl.arange(0, BLOCK_N)
        live = j < kv_len
        at = (tl.load(bt + j // BS, mask=live, other=0).to(tl.int64) * stride_cb + (j % BS) * stride_cs)[:, None] \
            + d[None, :]
        k = _codes(kc + at, live[:, None], BY_HAND)
        if QK8:
            s = tl.trans(tl.dot(k, q_hi_t) + tl.dot(k, q_lo_t) * 0.0625)   # [BLOCK_N, ROWS] -> [ROWS, BLOCK_N]
        else:
            s = tl.dot(q16, tl.trans(k.to(dot16)))
        s = tl.where(live[None, :], s * qk[:, None], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _codes(vc + at, live[:, None], BY_HAND)
        if PV8:
            p_hi, p_lo = _hi_lo(p * 256.0, BY_HAND)
            v_t = tl.trans(v)                                           # [D, BLOCK_N]: the MMA's A, keys as K
            acc = tl.dot(v_t, tl.trans(p_hi), acc * alpha[None, :]) + tl.dot(v_t, tl.trans(p_lo)) * 0.0625
        else:
            acc = tl.dot(p.to(dot16), v.to(dot16), acc * alpha[:, None])
        m_i = m_new
    if PV8:
        out = acc * (1.0 / 256.0) / tl.where(l_i > 0, l_i, 1.0)[None, :]
        tl.store(o_ptr + seq * stride_qt + head[None, :] * stride_qh + d[:, None], out.to(o_ptr.dtype.element_ty),
                 mask=ok[None, :])
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + seq * stride_qt + head[:, None] * stride_qh + d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=ok[:, None])


def mma_variant(qk8: bool, pv8: bool, q, kc, vc, lens, table, block_n: int, ws: bool = False, warps: int = 4,
                stages: int = 2):
    """One fp8 tensor-core variant's output and compiled kernel (per-tensor scales of 1.0)."""
    S, H_q, D = q.shape
    H_kv = kc.shape[2]
    out = torch.empty_like(q)
    compiled = _mma_kernel[(H_kv, S)](
        q, kernel_view(kc), kernel_view(vc), out, lens, table, D ** -0.5 * LOG2E, q.stride(0), q.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), table.stride(0), BS=kc.shape[1], G=H_q // H_kv,
        ROWS=max(16, triton.next_power_of_2(H_q // H_kv)), D=D, BLOCK_N=block_n, QK8=qk8, PV8=pv8,
        BY_HAND=INTERPRET, WS=ws, num_warps=warps, num_stages=stages)
    return out, compiled


def _quiet(fn):
    """fn() with the process's stderr (fd 2) muted: a failing MLIR pass prints its whole module there."""
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        return fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


WS_CONFIGS = ((False, 4, 2), (True, 4, 2), (True, 8, 2), (True, 4, 3), (True, 8, 3))   # (warp spec., warps, stages)


def _measure(fp8, base, ctx, nb):
    """Rows: the two peers, then each variant x WS_CONFIGS (checked, timed; a compile failure is a row)."""
    from benchmarks.bench_common import timed
    from l7_fast.attention_split import paged_attention_split
    from l9_fp8_kv import fp8_attention_ref, paged_attention_fp8_split
    q, kc, vc, _, _, _, lens, table = fp8
    ref = fp8_attention_ref(*fp8, window=None).float()
    peers = {"shipped e4m3": lambda: paged_attention_fp8_split(*fp8, max_seqlen_q=1, num_splits=1),
             "stage 7 bf16": lambda: paged_attention_split(*base, max_seqlen_q=1, max_seqlen_kv=ctx, num_splits=1)}
    rows = [dict(variant=k, us=timed("cuda", f) * 1e3, bytes=nb * (2 if "bf16" in k else 1)) for k, f in peers.items()]
    for label, (qk8, pv8), bn in MMA_VARIANTS:
        for ws, warps, stages in WS_CONFIGS:
            row = dict(variant=label, ws=ws, warps=warps, stages=stages, bytes=nb)
            run = lambda: mma_variant(qk8, pv8, q, kc, vc, lens, table, bn, ws, warps, stages)  # noqa: E731
            try:
                out, c = _quiet(run)
            except Exception as e:                                       # noqa: BLE001 (a compile failure is a result)
                row.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            else:
                row.update(err=(out.float() - ref).abs().max().item(), regs=c.n_regs, us=timed("cuda", run) * 1e3)
            rows.append(row)
    return rows


def _table(rows, bw, title) -> tuple[list[str], int]:
    """The markdown table (with % of copy bandwidth and x the shipped kernel) and the count of wrong rows."""
    md = [title, "", "| variant | warp spec. | warps | stages | us | % of copy | x shipped e4m3 | max err | regs |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    bad, shipped = 0, rows[0]["us"]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['variant']} | {'on' if r['ws'] else 'off'} | {r['warps']} | {r['stages']} | "
                      f"fails to compile: {r['error']} | | | | |")
            continue
        r["copy_frac"] = r["bytes"] / r["us"] / 1e3 / bw
        if "err" not in r:
            md.append(f"| {r['variant']} (peer) | | | | {r['us']:.1f} | {r['copy_frac']:.0%} | {shipped / r['us']:.2f} | | |")
            continue
        wrong = r["err"] > 5e-3
        bad += wrong
        md.append(f"| {r['variant']} | {'on' if r['ws'] else 'off'} | {r['warps']} | {r['stages']} | {r['us']:.1f} | "
                  f"{r['copy_frac']:.0%} | {shipped / r['us']:.2f} | {r['err']:.1e}{' WRONG' if wrong else ''} | "
                  f"{r['regs']} |")
    return md, bad


def _plot(rows, stem, title) -> None:
    from plumbing.plot import pyplot
    plt = pyplot()
    if plt is None:
        return
    ok = [r for r in rows if "us" in r]
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(ok) + 1.5))
    ax.barh(range(len(ok)), [r["copy_frac"] * 100 for r in ok])
    ax.set_yticks(range(len(ok)), [r["variant"] + (f", ws {'on' if r['ws'] else 'off'} {r['warps']}w {r['stages']}s"
                                                  if "ws" in r else "") for r in ok], fontsize=7)
    ax.set_xlabel("% of copy bandwidth (bytes read / time)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)


def main(argv=None) -> int:
    """The variants with and without Triton's warp specialisation, 64 x 4,096 (GPU only)."""
    from benchmarks.bench_common import ceilings
    from benchmarks.outputs import output_stem
    from plumbing.plot import wrote
    from l3_paged.paged_batch import make_paged_batch
    from l9_fp8_kv.attention import quantize_batch
    args = parse(argv if argv is not None else sys.argv[1:])
    if not torch.cuda.is_available():
        print("needs a GPU: warp specialisation is a pass of the CUDA compiler; the CPU check is "
              "`python -m benchmarks.studies.fp8_decode_study --quick`")
        return 2
    stem = output_stem("fp8_mma_variants", args.out, False, "cuda")
    t0, (B, ctx), heads = time.perf_counter(), (64, 4096), (32, 8, 128, 16)
    bw, _ = ceilings("cuda")
    name = torch.cuda.get_device_name()
    print(f"{name}; torch {torch.__version__}, triton {triton.__version__}; bf16 queries; B x ctx {B} x {ctx}; "
          f"H_q, H_kv, D, block {heads}; copy bandwidth {bw:.0f} GB/s", flush=True)
    base = make_paged_batch([1] * B, [ctx] * B, *heads, torch.bfloat16, "cuda", spare_blocks=0)
    rows = _measure(quantize_batch(base, False), base, ctx, 2 * B * ctx * heads[1] * heads[2])
    md, bad = _table(rows, bw, f"# fp8 MMA decode variants x warp specialisation ({name}, {B} x {ctx})")
    print("\n".join(md), flush=True)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    with open(stem + ".json", "w") as f:
        json.dump(dict(device=name, torch=torch.__version__, triton=triton.__version__, copy_gbs=bw, B=B, ctx=ctx,
                       heads=heads, rows=rows), f, indent=1)
    _plot(rows, stem, f"e4m3 decode into fp8 MMAs, with and without warp specialisation; {name}, {B} x {ctx}")
    fails = sum("error" in r for r in rows)
    print(f"{len(rows)} rows, {fails} failed to compile, {bad} wrong; {time.perf_counter() - t0:.0f} s; "
          + wrote(stem + ".json", stem + ".md", stem + ".png"))
    return 1 if bad else 0


if __name__ == "__main__":
    from plumbing.cli import run_main
    run_main(lambda: sys.exit(main()))
