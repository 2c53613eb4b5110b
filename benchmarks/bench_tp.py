"""Tensor parallelism over one host's GPUs (stage 12): single-stream decode and e2e throughput at tp 1
and tp 2 on a random-weight checkpoint of a real shape, bf16 greedy tokens of tp 2 against tp 1, and
the all-reduce of one decode step's activations (NCCL eager, NCCL replayed from a CUDA graph).

    python -m benchmarks.bench_tp                               # 2 GPUs, Qwen3-8B shape (builds 16 GB once)
    python -m benchmarks.bench_tp --preset Qwen/Qwen3-0.6B      # the small model, and why it gains little
    python -m benchmarks.bench_tp --quick                       # smoke test of the script (tiny model; CPU ok)

Rows: tp 1 with CUDA graphs (stage 7's engine as shipped), tp 1 eager, tp 2 with CUDA graphs (captured
on every rank, lesson 12) and our all-reduce, the same with NCCL's only (disable_custom_all_reduce),
tp 2 eager. Each runs in a process of its own. Single stream: one
64-token prompt, (time of 1 + N tokens - time of 1 token) / N. e2e: nano-vllm's workload (random
prompts and outputs, lengths uniform in [min, max], ignore_eos). Floor of a decode step: every weight
read once, split over the ranks, at the copy bandwidth measured here (bytes / (tp x BW)), plus the
step's all-reduces (2 a layer, one for the embedding) at NCCL's eager time measured here for one
token's activations. Tokens: 8 prompts, 32 greedy steps at tp 1 and tp 2 in bf16; bitwise equality
is not expected (the partial sums add in another order), so the first differing step is reported
with the two logit rows' largest difference and tp 1's top-2 margin there.
A GPU run writes benchmarks/results/bench_tp/<n>x<gpu>-<preset>.{json,md,png} (2xh200-qwen3-0-6b.json ...);
--quick writes under out/.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from benchmarks.outputs import RESULTS, gpu_slug, out_help, scratch_dir


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="Qwen/Qwen3-8B", help="the checkpoint's shape (l1_dense.config.PRESETS)")
    ap.add_argument("--tp", type=int, default=2, help="the tensor-parallel size compared with 1")
    ap.add_argument("--requests", type=int, default=256, help="e2e requests (nano-vllm's: 256)")
    ap.add_argument("--min-len", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--stream-tokens", type=int, default=128, help="single-stream tokens timed")
    ap.add_argument("--skip", default="", help="comma-separated rows to leave out: graphs,eager,tp,tp-nccl,tp-eager,"
                    "tokens,allreduce")
    ap.add_argument("--out", default=None, help=out_help("bench_tp"))
    ap.add_argument("--quick", action="store_true", help="tiny model, 4 short requests, gloo on a CPU: smoke test")
    return ap.parse_args(argv)


def child(spec: dict, label: str) -> dict:
    t = time.perf_counter()
    print(f"bench_tp: {label} ...", file=sys.stderr, flush=True)
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench_tp_child", json.dumps(spec)], stdout=subprocess.PIPE,
                       text=True)
    if r.returncode != 0 or not r.stdout.strip():
        raise SystemExit(f"bench_tp: {label} failed (exit {r.returncode}); its error is above")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"bench_tp: {label} done in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return out


def first_difference(a_file: str, b_file: str) -> list[dict]:
    """Per prompt: the first step whose greedy token differs, the logits' largest difference there,
    and tp 1's margin between its top two."""
    import torch
    rows = []
    for (ta, la), (tb, lb) in zip(torch.load(a_file), torch.load(b_file)):
        step = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
        i = step if step is not None else len(ta) - 1
        top2 = la[i].topk(2).values
        rows.append(dict(first_diff_step=step, steps=len(ta), max_logit_diff=float((la[i] - lb[i]).abs().max()),
                         max_logit_diff_before=float((la[:i] - lb[:i]).abs().max()) if i else 0.0,
                         tp1_margin=float(top2[0] - top2[1])))
    return rows


def main(argv=None):
    a = parse(argv)
    import torch

    from benchmarks.bench_common import NOT_JUDGED, ceilings
    from l1_dense.config import PRESETS
    skip = set(filter(None, a.skip.split(",")))
    ngpu = torch.cuda.device_count()
    device = "cuda" if ngpu else "cpu"
    if device == "cpu" and not a.quick:
        sys.exit("no GPU: run with --quick to smoke-test the script (CPU numbers are not performance)")
    if device == "cuda" and ngpu < a.tp:
        sys.exit(f"--tp {a.tp} needs {a.tp} GPUs and {ngpu} are visible")
    scratch = scratch_dir("bench_tp")
    if a.quick:
        from plumbing.tiny import tiny_checkpoint
        path, preset, dtype = str(tiny_checkpoint("qwen3")), "tiny-qwen3", "float32" if device == "cpu" else "bfloat16"
        a.requests, a.min_len, a.max_len, a.stream_tokens = 4, 4, 12, 4
    else:
        from harness.random_checkpoint import build_checkpoint
        preset, dtype = a.preset, "bfloat16"
        path = build_checkpoint(os.path.join(scratch, preset.split("/")[-1].lower() + "-random"), preset)
    base = dict(kind="engine", path=path, device=device, dtype=dtype, requests=a.requests, min_len=a.min_len,
                max_len=a.max_len, stream_tokens=a.stream_tokens, tokens=False, token_prompts=8,
                token_steps=32 if not a.quick else 4)
    rows = {}
    plan = [("graphs", "tp 1 (graphs)", 1, False, False), ("eager", "tp 1 eager", 1, True, False),
            ("tp", f"tp {a.tp} (graphs)", a.tp, False, False), ("tp-nccl", f"tp {a.tp} (graphs, NCCL only)", a.tp, False, True),
            ("tp-eager", f"tp {a.tp} eager", a.tp, True, False)]
    for name, label, tp, eager, nccl in plan:
        if name not in skip and not (device == "cpu" and (not eager or nccl)):   # no graphs, no NCCL on a CPU
            rows[label] = dict(child(dict(base, tp=tp, eager=eager, nccl_only=nccl), label), tp=tp, eager=eager,
                               nccl_only=nccl)
    tokens = None
    if "tokens" not in skip:
        files = [os.path.join(scratch, f"tokens_tp{tp}.pt") for tp in (1, a.tp)]
        for tp, f in zip((1, a.tp), files):
            child(dict(base, tp=tp, eager=True, tokens=True, tokens_file=f), f"greedy tokens and logits, tp {tp}")
        tokens = first_difference(*files)
    ar = None
    if device == "cuda" and "allreduce" not in skip:
        cfg = PRESETS.get(preset)
        hidden = cfg.hidden_size if cfg else 4096
        sizes = [2 * hidden * b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
        ar = child(dict(kind="allreduce", size=a.tp, sizes=sizes, path=os.path.join(scratch, "allreduce.json")),
                   f"all-reduce probe, {a.tp} GPUs")["rows"]
    bw, _ = ceilings(device)
    report(a, device, preset, dtype, path, rows, tokens, ar, bw, ngpu, NOT_JUDGED)


def report(a, device, preset, dtype, path, rows, tokens, ar, bw, ngpu, not_judged) -> None:
    import torch

    from benchmarks.bench_tp_report import floors, save, table
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    meta = dict(device=name, gpus=ngpu, preset=preset, dtype=dtype, tp=a.tp, requests=a.requests,
                lengths=[a.min_len, a.max_len], stream_tokens=a.stream_tokens, copy_GBps=bw, quick=a.quick,
                nccl=".".join(map(str, torch.cuda.nccl.version())) if device == "cuda" else None,
                torch=torch.__version__)
    floors(meta, rows, ar, path)
    print(table(meta, rows, tokens, ar))
    if a.quick or device != "cuda":
        print(not_judged)
    stem = os.path.join(a.out, "bench_tp") if a.out else (
        str(RESULTS / "bench_tp" / f"{ngpu}x{gpu_slug(name)}-{re.sub('[^a-z0-9]+', '-', preset.split('/')[-1].lower())}")
        if device == "cuda" and not a.quick
        else os.path.join(scratch_dir("bench_tp"), "bench_tp"))
    save(stem, dict(meta=meta, rows=rows, tokens=tokens, allreduce=ar))


if __name__ == "__main__":
    parse(sys.argv[1:])                      # a bad flag stops here, before torch loads
    from plumbing.cli import run_main
    run_main(main)
