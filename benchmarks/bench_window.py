"""Sliding-window attention: a long context with a window costs what the window's length costs.

    python -m benchmarks.bench_window            # GPU (about 1 minute cold)
    python -m benchmarks.bench_window --quick    # CPU: smoke-test the script (float16, small)

Qwen3-8B's attention (H_q 32, H_kv 8, D 128), bf16, block 16, shuffled block table. Each case is
checked against the reference (``window_attention_ref``) with NaN written into every block below
the window (a kernel that loads one such key returns NaN), then timed from a CUDA graph with L2
flushed (timing.graph_ms: what a CUDA-graph decode step pays). Measured in the same run:

  decode    stage 8 (split-KV over the window) at B x ctx, W = 4096, ctx = 4096 and 32768
            stage 7 (split-KV, no window) at B x 4096 and B x 32768: the peers
            SDPA on dense [B, H, W, D] (the window's keys only, gathered beforehand)
  prefill   one causal prompt of T = 16384: stage 8 with W = 4096 against stage 3 without

Goal (issue 19): decode at 1 x 32768 with W = 4096 costs <= 1.2x decode at 1 x 4096 (stage 7).
Decode is scored in GB/s (K/V bytes the window needs) against a copy measured here.
A GPU run writes benchmarks/results/bench_window/<gpu>.{json,md,png}; --quick writes under out/.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("bench_window"))
    ap.add_argument("--quick", action="store_true", help="small shapes in float16: smoke-test the script (CPU ok)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch  # noqa: E402

import plumbing.runtime  # noqa: E402,F401  (before triton: picks GPU or interpreter; stage packages import lazily)
from benchmarks.attention_peers import sdpa  # noqa: E402
from benchmarks.bench_common import NOT_JUDGED, bench_device, ceilings, timed  # noqa: E402
from benchmarks.outputs import output_stem  # noqa: E402
from l3_paged.attention_triton import paged_attention_triton  # noqa: E402
from l3_paged.paged_batch import make_paged_batch  # noqa: E402
from l7_fast.attention_split import _num_sms, paged_attention_split, pick_num_splits  # noqa: E402
from l8_sliding_window import paged_attention_window, window_attention_ref  # noqa: E402
from l8_sliding_window.attention import poison_below_window  # noqa: E402
from l8_sliding_window.attention_split import paged_attention_window_split  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import pyplot, wrote  # noqa: E402

H_Q, H_KV, D, BS = 32, 8, 128, 16



def decode_rows(device, dtype, batches, ctxs, window, bw):
    rows, sms = [], _num_sms(torch.device(device))
    for B in batches:
        for ctx in ctxs:
            args = make_paged_batch([1] * B, [ctx] * B, H_Q, H_KV, D, BS, dtype, device, spare_blocks=0)
            ns = pick_num_splits(B, H_KV, ctx, sms)
            keys = min(ctx, window)
            nbytes = 2 * B * keys * H_KV * D * args[1].element_size()
            ref = window_attention_ref(*args, window=window)
            plain = lambda: paged_attention_split(*args, max_seqlen_q=1, max_seqlen_kv=ctx, num_splits=ns)  # noqa: E731
            ms_plain = timed(device, plain)
            poison_below_window(args, [1] * B, window)
            win = lambda: paged_attention_window_split(*args, max_seqlen_q=1, window=window, num_splits=ns)  # noqa: E731
            err = (win().float() - ref.float()).abs().max().item()
            ms_win = timed(device, win)
            qd = args[0].view(B, H_Q, 1, D)
            kd, vd = (torch.randn(B, H_KV, keys, D, device=device, dtype=dtype) for _ in range(2))
            ms_sdpa = timed(device, lambda: sdpa(qd, kd, vd, False))     # K and V apart: SDPA reads both
            rows.append(dict(kind="decode", B=B, ctx=ctx, window=window, splits=ns, max_abs_err=err,
                             stage8_ms=ms_win, stage7_ms=ms_plain, sdpa_window_ms=ms_sdpa,
                             stage8_gbps=nbytes / ms_win / 1e6,
                             stage8_copy_frac=(nbytes / ms_win / 1e6) / bw if bw else None))
            print(f"  decode {B}x{ctx} W={window}: stage 8 {ms_win * 1e3:.1f} us, stage 7 (no window) "
                  f"{ms_plain * 1e3:.1f} us, SDPA on the window {ms_sdpa * 1e3:.1f} us, err {err:.2e}", flush=True)
    return rows


def prefill_row(device, dtype, T, window):
    args = make_paged_batch([T], [T], H_Q, H_KV, D, BS, dtype, device)
    win = lambda: paged_attention_window(*args, max_seqlen_q=T, window=window)  # noqa: E731
    full = lambda: paged_attention_triton(*args, max_seqlen_q=T)  # noqa: E731
    err = (win().float() - window_attention_ref(*args, window=window).float()).abs().max().item()
    ms_win, ms_full = timed(device, win), timed(device, full)
    print(f"  prefill T={T} W={window}: stage 8 {ms_win:.3f} ms, stage 3 (no window) {ms_full:.3f} ms", flush=True)
    return dict(kind="prefill", T=T, window=window, max_abs_err=err, stage8_ms=ms_win, stage3_ms=ms_full)


def main(argv=None):
    args = parse(argv)
    device = bench_device(args.quick)
    stem = output_stem("bench_window", args.out, args.quick, device)
    dtype = torch.float16 if args.quick else torch.bfloat16
    t0 = time.perf_counter()
    bw, _ = ceilings(device)
    W = 64 if args.quick else 4096
    rows = decode_rows(device, dtype, [1] if args.quick else [1, 8], [W, 8 * W], W, bw)
    rows.append(prefill_row(device, dtype, 4 * W, W))
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    bad = [r for r in rows if not r["max_abs_err"] <= tol]
    by = {(r["B"], r["ctx"]): r for r in rows if r["kind"] == "decode"}
    long, short = by[(1, 8 * W)], by[(1, W)]
    ratio = long["stage8_ms"] / short["stage7_ms"]
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter: not performance)"
    lines = [f"# Sliding-window attention, {name}, {dtype}, H_q {H_Q}, H_kv {H_KV}, D {D}, block {BS}",
             "", "| case | stage 8 (window) | stage 7 / 3 (no window) | SDPA on the window's keys | splits | "
             "GB/s (window bytes) | % of copy BW |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["kind"] == "decode":
            frac = f"{100 * r['stage8_copy_frac']:.0f}%" if r["stage8_copy_frac"] else "-"
            lines.append(f"| decode {r['B']}x{r['ctx']}, W {r['window']} | {r['stage8_ms'] * 1e3:.1f} us | "
                         f"{r['stage7_ms'] * 1e3:.1f} us | {r['sdpa_window_ms'] * 1e3:.1f} us | {r['splits']} | "
                         f"{r['stage8_gbps']:.0f} | {frac} |")
        else:
            lines.append(f"| prefill T={r['T']}, W {r['window']} | {r['stage8_ms']:.3f} ms | {r['stage3_ms']:.3f} ms "
                         "| - | - | - | - |")
    lines += ["", f"copy bandwidth measured here: {bw:.0f} GB/s" if bw else "copy bandwidth: not measured (CPU)",
              NOT_JUDGED if args.quick else f"goal: decode 1x{8 * W} with W {W} <= 1.2x decode 1x{W} (stage 7): "
              f"{ratio:.2f}x -> " + ("met" if ratio <= 1.2 else "NOT met"),
              f"checks: {len(rows) - len(bad)} of {len(rows)} cases equal the reference within {tol} "
              f"(NaN below the window)", f"total {time.perf_counter() - t0:.0f} s"]
    print("\n".join(lines))
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(stem + ".json", "w") as f:
        json.dump(dict(device=name, dtype=str(dtype), copy_gbps=bw, ratio_long_over_short=ratio, rows=rows), f,
                  indent=1)
    plt = pyplot()
    if plt is not None:
        dec = [r for r in rows if r["kind"] == "decode"]
        fig, ax = plt.subplots(figsize=(8, 4))
        xs = range(len(dec))
        for off, key, label in ((-0.27, "stage8_ms", "stage 8, window"), (0, "stage7_ms", "stage 7, no window"),
                                (0.27, "sdpa_window_ms", "SDPA, window's keys")):
            ax.bar([x + off for x in xs], [r[key] * 1e3 for r in dec], 0.27, label=label)
        ax.set_xticks(list(xs), [f"{r['B']}x{r['ctx']}" for r in dec])
        ax.set(ylabel="us per call (CUDA graph)", title=f"decode, W = {W}, {name}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=110)
    print(wrote(stem + ".json", stem + ".md", stem + ".png"))
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
