"""Batch variance on the GPU, in bf16: is a row the same bits in every batch? And what the invariant
kernels of l13_batch_invariant cost.

    python -m benchmarks.bench_batch_invariant            # one GPU, under 2 minutes; --quick: fewer M

(a) torch (F.linear: cuBLAS) at Qwen3-0.6B's and Qwen3-8B's matmul shapes: x [256, K] random; each
    row alone (M = 1) against the same rows inside F.linear(x[:M]) for M = 1..256. Prints how many M
    changed any bit of any row (the wall of lesson 13).
(b) the same for l13's matmul (host's choice of launch), and its fold vs split launches.
(c) attention, 0.6B heads (16 q, 8 kv, D 128), a 1,000-token sequence: each probed position's row
    inside a batched prefill, decoded alone (fold and split launches) and as a 4-token verification
    step: l13's kernel against stage 3's + stage 7's (split count from the batch).
(d) times, CUDA-graph replay with L2 flushed (benchmarks/timing.graph_ms): ours vs F.linear at
    M = 1, 8, 64, 256 (decode) and 2048 (prefill), with % of copy bandwidth (bytes: weights + x + y)
    and TFLOP/s.
Writes benchmarks/results/bench_batch_invariant/<gpu>.{json,md,png} (--quick: out/; --replot JSON draws the PNG).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

from benchmarks.outputs import out_help, output_stem, save_results
from benchmarks.timing import copy_bandwidth, graph_ms, timer
from plumbing.cli import run_main
from plumbing.errors import UserError
from plumbing.plot import wrote

#: (model, name, N, K): the linear layers of one decoder layer (q/k/v and gate/up merged, as FusedOps
#: runs them) and the lm_head
SHAPES = (("0.6B", "qkv", 4096, 1024), ("0.6B", "o_proj", 1024, 2048), ("0.6B", "gate_up", 6144, 1024),
          ("0.6B", "down", 1024, 3072), ("0.6B", "lm_head", 151936, 1024),
          ("8B", "qkv", 6144, 4096), ("8B", "o_proj", 4096, 4096), ("8B", "gate_up", 24576, 4096),
          ("8B", "down", 4096, 12288), ("8B", "lm_head", 151936, 4096))
TIME_MS = (1, 8, 64, 256, 2048)
T0 = time.perf_counter()


def say(text: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {text}", flush=True)


def weights(N: int, K: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
    x = torch.randn(2048, K, device="cuda", generator=g).to(torch.bfloat16)
    return x, w


def variance(mm, x, w, ms) -> dict:
    """How many M (of ``ms``) change any bit of rows 0..M-1 against those rows computed alone."""
    alone = torch.cat([mm(x[i:i + 1], w) for i in range(max(ms))])              # [256, N]
    bad, worst = [], 0.0
    for m in ms:
        out = mm(x[:m], w)
        if not torch.equal(out, alone[:m]):
            bad.append(m)
            worst = max(worst, (out.float() - alone[:m].float()).abs().max().item())
    return dict(ms_that_differ=len(bad), of=len(ms), first=bad[:8], max_abs_diff=worst)


def matmul_variance(quick: bool) -> list:
    from l13_batch_invariant.matmul import K_CHUNK, matmul
    ms = list(range(1, 257, 15 if quick else 1))
    rows = []
    for model, name, N, K in SHAPES:
        if name == "lm_head" and quick:
            continue
        x, w = weights(N, K)
        t = variance(F.linear, x, w, ms)
        o = variance(matmul, x, w, ms)
        fold_split = "n/a (one chunk)" if K <= K_CHUNK else \
            all(torch.equal(matmul(x[:m], w, split=False), matmul(x[:m], w, split=True)) for m in (1, 7, 64))
        rows.append(dict(model=model, name=name, N=N, K=K, torch=t, ours=o, ours_fold_equals_split=fold_split))
        say(f"(a,b) {model} {name:8s} [{K} -> {N}]: torch: {t['ms_that_differ']}/{t['of']} M differ "
            f"(first {t['first']}, max |diff| {t['max_abs_diff']:.3g}); ours: {o['ms_that_differ']}/{o['of']}; "
            f"ours fold == split: {fold_split}")
    return rows


def attention_variance() -> dict:
    from l3_paged.attention_triton import paged_attention_triton
    from l3_paged.paged_batch import make_paged_batch
    from l7_fast.attention_split import paged_attention_split
    from l13_batch_invariant.attention import paged_attention_invariant
    H_q, H_kv, D, L = 16, 8, 128, 1000
    q, K, V, cu, kv, bt = make_paged_batch([7, L, 1], [300, L, 700], H_q, H_kv, D, 16, torch.bfloat16, "cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    s0, table = cu[1].item(), bt[1:2]

    def one(fn, n, p, **kw):          # the sequence's last n tokens ending at position p, alone
        return fn(q[s0 + p - n + 1:s0 + p + 1], K, V, torch.tensor([0, n], **i32), torch.tensor([p + 1], **i32),
                  table, max_seqlen_q=n, **kw)[-1]
    out = {}
    for label, fn, whole_fn in (("l13 invariant", paged_attention_invariant, paged_attention_invariant),
                                ("stage 3 + stage 7 split", paged_attention_split, paged_attention_triton)):
        whole = whole_fn(q, K, V, cu, kv, bt, max_seqlen_q=L)
        diff = {"decode": 0, "decode split": 0, "verify 4": 0}
        probes = list(range(3, L, 37)) + [255, 256, 511, 512, L - 1]
        for p in probes:
            row = whole[s0 + p]
            diff["decode"] += not torch.equal(one(fn, 1, p, num_splits=1), row)
            # stage 7: the split count its rule picks for a batch of one; l13: four split programs
            diff["decode split"] += not torch.equal(one(fn, 1, p, num_splits=4 if fn is paged_attention_invariant
                                                        else None), row)
            diff["verify 4"] += not torch.equal(one(fn, 4, p), row)
        out[label] = dict(positions=len(probes), differ=diff)
        say(f"(c) attention {label}: of {len(probes)} positions, rows that differ from the batched prefill's: {diff}")
    return out


def timings(quick: bool) -> list:
    from l13_batch_invariant.matmul import matmul
    gbps = copy_bandwidth(timer("cuda"), "cuda", 2 ** 30)
    say(f"copy bandwidth {gbps:.0f} GB/s (read + write)")
    rows = []
    for model, name, N, K in SHAPES:
        x, w = weights(N, K)
        for M in TIME_MS:
            if (name == "lm_head" and M > 256) or (quick and M not in (1, 256, 2048)):
                continue
            a = x[:M]
            nbytes, flops = 2 * (N * K + M * K + M * N), 2 * M * N * K
            ours, ref = graph_ms(lambda: matmul(a, w)), graph_ms(lambda: F.linear(a, w))
            r = dict(model=model, name=name, M=M, N=N, K=K, ours_us=ours * 1e3, torch_us=ref * 1e3,
                     ours_pct_copy=100 * nbytes / ours / 1e6 / gbps, torch_pct_copy=100 * nbytes / ref / 1e6 / gbps,
                     ours_tflops=flops / ours / 1e9, torch_tflops=flops / ref / 1e9, ours_over_torch=ours / ref)
            rows.append(r)
            say(f"(d) {model} {name:8s} M={M:5d}: ours {r['ours_us']:8.1f} us ({r['ours_pct_copy']:3.0f}% copy, "
                f"{r['ours_tflops']:5.1f} TF/s)  torch {r['torch_us']:8.1f} us ({r['torch_pct_copy']:3.0f}%, "
                f"{r['torch_tflops']:5.1f} TF/s)  ours/torch {r['ours_over_torch']:.2f}x")
    return rows


def markdown(res: dict) -> str:
    lines = [f"# bench_batch_invariant: {res['device']}, bf16, torch {res['torch']}", "",
             "| model | matmul | [K -> N] | torch: M that differ | ours: M that differ | ours fold == split |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['name']} | {r['K']} -> {r['N']} | {r['torch']['ms_that_differ']}/{r['torch']['of']}"
              f" | {r['ours']['ms_that_differ']}/{r['ours']['of']} | {r['ours_fold_equals_split']} |"
              for r in res["variance"]]
    lines += ["", "| attention | positions | differ: decode, decode split, verify 4 |", "|---|---|---|"]
    lines += [f"| {k} | {v['positions']} | {v['differ']} |" for k, v in res["attention"].items()]
    lines += ["", "| model | matmul | M | ours µs | torch µs | ours / torch | ours % copy | torch % copy "
              "| ours TF/s |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['name']} | {r['M']} | {r['ours_us']:.1f} | {r['torch_us']:.1f} | "
              f"{r['ours_over_torch']:.2f}x | {r['ours_pct_copy']:.0f}% | {r['torch_pct_copy']:.0f}% | "
              f"{r['ours_tflops']:.1f} |" for r in res["timings"]]
    return "\n".join(lines) + "\n"


def draw(res: dict):
    """ours / torch time against M, one line per matmul, a panel per model."""
    def go(plt, path):
        models = sorted({r["model"] for r in res["timings"]})
        fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.4), squeeze=False)
        for ax, model in zip(axes[0], models):
            for name in dict.fromkeys(r["name"] for r in res["timings"] if r["model"] == model):
                rows = [r for r in res["timings"] if r["model"] == model and r["name"] == name]
                ax.plot([r["M"] for r in rows], [r["ours_over_torch"] for r in rows], marker="o", label=name)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set(title=f"{model}: l13 matmul / cuBLAS time", xlabel="M (rows in the step)", ylabel="ratio")
            ax.legend(fontsize=7)
        fig.suptitle(f"{res['device']}, bf16: the same bits for every M, at this cost", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    return go


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="every 15th M, no lm_head variance, 3 M timed (out/)")
    p.add_argument("--out", default=None, help=out_help("bench_batch_invariant"))
    p.add_argument("--replot", default=None, metavar="JSON", help="only draw the .png beside a saved JSON")
    args = p.parse_args(argv)
    if args.replot:
        from plumbing.plot import pyplot
        if args.quick or args.out:
            print("note: --quick and --out are ignored with --replot: it draws the PNG beside the JSON given")
        plt, stem = pyplot(), os.path.splitext(args.replot)[0]
        if plt is not None:
            draw(json.load(open(args.replot)))(plt, stem + ".png")
        print(wrote(stem + ".png"))
        return
    if not torch.cuda.is_available():
        raise UserError("bench_batch_invariant measures the GPU's batch variance: it needs CUDA "
                        "(the CPU checks are tests/test_l13_invariance.py)")
    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, dtype="bfloat16",
               variance=matmul_variance(args.quick), attention=attention_variance(), timings=timings(args.quick))
    stem = output_stem("bench_batch_invariant", args.out, args.quick, "cuda")
    print(markdown(res))
    say(wrote(*save_results(stem, res, markdown(res), draw(res))))


if __name__ == "__main__":
    run_main(main)
