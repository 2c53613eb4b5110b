"""Stage 7's optimisation ledger, measured: each fast path switched on in turn, in one run.

    PYTHONPATH=. python scripts/bench_l7.py                  # GPU: Qwen3-0.6B shape, random weights, bf16
    PYTHONPATH=. python scripts/bench_l7.py --quick          # CPU smoke test of the script (tiny model)

Rows (cumulative):
    stage 6          the engine before this lesson (stage 3's kernel, torch ops, 7 copies per step)
    + inputs         l7 runner, eager: pinned inputs, one copy, incremental block table, no per-layer checks
    + fused ops      + fused add+RMSNorm, q/k-norm+RoPE+KV-write, SiLU*mul, merged qkv / gate_up matmuls
    + CUDA graphs    + decode steps replay one graph per batch bucket
    + split-KV       + decode attention split over the keys
    + host fast path + a steady decode step scheduled, advanced, sampled and stop-checked in one
                     pass each, block-table changes sent by the scheduler (the full stage 7)
Peer, in the same run: transformers' ``generate`` on the same checkpoint (single stream).

Per row:
    single stream    one request, 512-token prompt, 256 new tokens (greedy, ignore_eos):
                     ms per decoded token = (t(257 new) - t(1 new)) / 256
    batch 64         64 such requests decoding together: ms per step, from the same difference
    steady           16 steady decode steps (one block's worth) at batch 1 and at batch 64: ms per
                     step, and the host parts of a step (schedule, inputs, advance, stats, sample;
                     l7_fast.profile); graph memory
    host, 256        the last two rows at 256 running requests (prompts of 512..527 tokens, so
                     block boundaries are spread over the steps as in real traffic): ms per step
                     (unprofiled), host ms per step and its parts (median over 48 steps, the two
                     engines alive at once and stepped in interleaved blocks of 8), GPU busy
    profile          torch.profiler over 8 such steps, LAST (once the profiler has run, every later
                     launch in the process is slower; HF is timed before it):
                     GPU kernels per step, host launch calls per step, GPU busy ms per step;
                     busy % = busy ms / unprofiled ms per step
Roofline: a decode step must read every weight once and the K/V in use; floor = bytes / copy
bandwidth measured here; fraction = floor / measured. Writes bench_l7.{json,md,png} into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import l7_fast  # noqa: E402,F401  (before triton: picks GPU or interpreter)
from bench_e2e import build_checkpoint, ceilings, free, sync  # noqa: E402
from l1_dense.checkpoint import load_model  # noqa: E402
from l1_dense.tiny import tiny_checkpoint  # noqa: E402
from l4_sampler.params import SamplingParams  # noqa: E402
from l5_scheduler.config import make_config  # noqa: E402
from l6_prefix_cache.engine import LLMEngine as Stage6Engine  # noqa: E402
from l7_fast.engine import LLMEngine as Stage7Engine  # noqa: E402
from l7_fast.profile import kernel_profile, summarize_timings  # noqa: E402

ROWS = [("stage 6", None),
        ("+ inputs", dict(enforce_eager=True, fused_ops=False, split_kv=False, host_fast_path=False)),
        ("+ fused ops", dict(enforce_eager=True, fused_ops=True, split_kv=False, host_fast_path=False)),
        ("+ CUDA graphs", dict(enforce_eager=False, fused_ops=True, split_kv=False, host_fast_path=False)),
        ("+ split-KV", dict(enforce_eager=False, fused_ops=True, split_kv=True, host_fast_path=False)),
        ("+ host fast path", dict(enforce_eager=False, fused_ops=True, split_kv=True, host_fast_path=True))]
HOST_ROWS = ROWS[-2:]                                          # before / after the host fast path, at 256


def make(model, config, fast):
    if fast is None:
        return Stage6Engine(model, None, config, enable_prefix_caching=True)
    return Stage7Engine(model, None, config, enable_prefix_caching=True, **fast)


def add(engine, prompts, new):
    for p in prompts:
        engine.add_request({"prompt_token_ids": p}, SamplingParams(temperature=0, ignore_eos=True, max_tokens=new))


def run(engine, prompts, new) -> float:
    add(engine, prompts, new)
    sync()
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    sync()
    return time.perf_counter() - t


def per_decode_step(model, config, fast, prompts, new) -> tuple[float, list[int]]:
    """ms per decode step: (t(new + 1) - t(1)) / new, each on a fresh engine (no cached prefix)."""
    t1 = run(make(model, config, fast), prompts, 1)
    e = make(model, config, fast)
    tn = run(e, prompts, new + 1)
    return (tn - t1) / new * 1e3, [list(r.output_ids) for r in e.requests.values()]


def _decoding(model, config, fast, prompts, steps):
    e = make(model, config, fast)
    add(e, prompts, 2 * steps + 8)                             # still decoding when the measurement ends
    e.step()
    while e.stats[-1].prefill_tokens:                          # until every request is decoding
        e.step()
    for _ in range(3):
        e.step()
    return e


def steady_time(model, config, fast, prompts, steps=16, host=True) -> dict:
    """ms per step of `steps` steady decode steps, and (stage 7, `host`) the host parts of a step."""
    e = _decoding(model, config, fast, prompts, steps)
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        e.step()
    sync()
    out = dict(ms_per_step=(time.perf_counter() - t) / steps * 1e3)
    if host and isinstance(e, Stage7Engine):                   # host parts, on a second engine
        e2 = _decoding(model, config, dict(fast, profile=True), prompts, steps)
        for _ in range(steps):
            e2.step()
        modes = summarize_timings(e2.timings[-steps:])
        mode = max(modes, key=lambda m: modes[m]["steps"])
        out["host"] = dict(mode=mode, **{k: round(v, 4) for k, v in modes[mode].items()})
        out["graph_bytes"], out["capture_s"] = e2.runner.graph_bytes, e2.runner.capture_s
    return out


def host_ab(model, config, rows, prompts, rounds=6, block=8) -> dict:
    """Host time per steady decode step of each row's engine, all alive at once, in interleaved
    blocks of `block` steps (`rounds` each), so drift of the machine hits every row alike; the
    median over the steps is robust to a stray slow step. profile=True: a sync after each forward
    separates the host's time from the GPU's."""
    engines = {label: _decoding(model, config, dict(fast, profile=True), prompts, rounds * block) for label, fast in rows}
    for e in engines.values():
        e.timings.clear()
    for _ in range(rounds):
        for e in engines.values():
            for _ in range(block):
                e.step()
    out = {}
    for label, e in engines.items():
        t = e.timings
        keys = [k for k in t[0] if k.endswith("_ms")]
        out[label] = dict(mode=max({x["mode"] for x in t}, key=[x["mode"] for x in t].count), steps=len(t),
                          **{k: round(statistics.median(x[k] for x in t), 4) for k in keys},
                          host_ms_mean=round(statistics.fmean(x["host_ms"] for x in t), 4))
    return out


def steady_kernels(model, config, fast, prompts, steps=16) -> dict:
    """torch.profiler over `steps` steady decode steps. Run after every timing: once the profiler
    has run, every later kernel launch in the process is slower (CUPTI stays attached)."""
    e = _decoding(model, config, fast, prompts, steps)
    k = kernel_profile(lambda: [e.step() for _ in range(steps)])
    return dict(kernels=k["kernels"] / steps, launch_calls=k["launch_calls"] / steps,
                gpu_busy_ms=k["gpu_busy_ms"] / steps, top=[[n, c / steps, t / steps] for n, c, t in k["top"]])


def hf_ms_per_token(path, prompt, new, device) -> float:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    ids = torch.tensor([prompt], device=device)

    def gen(n):
        sync()
        t = time.perf_counter()
        m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        sync()
        return time.perf_counter() - t
    gen(2)
    ms = (gen(new + 1) - gen(1)) / new * 1e3
    del m
    free()
    return ms


def host_parts(h: dict) -> str:
    return ", ".join(f"{k[:-3]} {h[k]:.3f}" for k in ("schedule_ms", "inputs_ms", "advance_ms", "stats_ms", "sample_ms")
                     if k in h)


def floor_ms(cfg, batch, ctx, bw_gbps) -> float:
    """Bytes a decode step must move: every weight once (lm_head included), K/V of `batch` x `ctx`."""
    per_layer = (cfg.hidden_size * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
                 + cfg.num_heads * cfg.head_dim * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size)
    weights = (cfg.num_layers * per_layer + cfg.vocab_size * cfg.hidden_size) * 2
    kv = batch * ctx * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    return (weights + kv) / (bw_gbps * 1e9) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench_l7")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new", type=int, default=256, help="decoded tokens, single stream")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-new", type=int, default=64, help="decoded tokens per request at --batch")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--host-batch", type=int, default=256, help="also profile the full stage 7 at this many running "
                    "requests (0: skip)")
    ap.add_argument("--rows", default=None, help="comma-separated row indices to run (default all)")
    ap.add_argument("--quick", action="store_true", help="tiny model, short runs: smoke-test the script (CPU ok)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not a.quick:
        sys.exit("no GPU: run with --quick to smoke-test the script (CPU numbers are not performance)")
    os.makedirs(a.out, exist_ok=True)
    if a.quick:
        path, model_name = str(tiny_checkpoint("qwen3")), "tiny-qwen3"
        a.prompt_len, a.new, a.batch, a.batch_new = 16, 4, 4, 3
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
    else:
        path, model_name, dtype = build_checkpoint(os.path.join("out", "bench_e2e", "qwen3-0.6b-random")), \
            "Qwen3-0.6B shape, random weights", torch.bfloat16
    model = load_model(Path(path), device, dtype)
    cfg = model.cfg
    rng = random.Random(0)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(a.prompt_len)] for _ in range(a.batch)]
    ctx = a.prompt_len + max(a.new, a.batch_new) + 2
    config = make_config(cfg, device, dtype, num_gpu_blocks_override=a.batch * (-(-ctx // 16)) + 64,
                         max_num_seqs=max(a.batch, 1), max_model_len=min(cfg.max_position_embeddings, 4096))
    bw, tf = ceilings(device)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'unknown'})"
    print(f"{name}, {model_name}, {str(dtype)[6:]}; single stream: {a.prompt_len}-token prompt, {a.new} new; "
          f"batch {a.batch}: {a.batch_new} new each" + (f"; copy {bw:.0f} GB/s" if bw else ""))
    chosen = range(len(ROWS)) if a.rows is None else [int(i) for i in a.rows.split(",")]
    rows, tokens = [], {}
    for i in chosen:
        label, fast = ROWS[i]
        t = time.perf_counter()
        run(make(model, config, fast), prompts[:1], 2)         # compile every shape the timed runs use
        run(make(model, config, fast), prompts, 2)             # (prefill kernels too), capture; not timed
        free()                                                 # (and their memory back before the timed ones)
        r = dict(row=label, fast=fast)
        r["single_ms"], tok1 = per_decode_step(model, config, fast, prompts[:1], a.new)
        r["batch_ms"], tokb = per_decode_step(model, config, fast, prompts, a.batch_new)
        r["batch_tok_s"] = a.batch / r["batch_ms"] * 1e3
        tokens[label] = (tok1, tokb)
        if device == "cuda":
            r["profile_1"] = steady_time(model, config, fast, prompts[:1])
            r["profile_b"] = steady_time(model, config, fast, prompts)
            r["single_roofline_pct"] = 100 * floor_ms(cfg, 1, a.prompt_len + a.new // 2, bw) / r["single_ms"]
            r["batch_roofline_pct"] = 100 * floor_ms(cfg, a.batch, a.prompt_len + a.batch_new // 2, bw) / r["batch_ms"]
        r["same_tokens_as_row0"] = tokens[label] == next(iter(tokens.values()))
        rows.append(r)
        p1, pb = r.get("profile_1", {}), r.get("profile_b", {})
        print(f"{label:16s} single {r['single_ms']:7.2f} ms/token  batch {a.batch}: {r['batch_ms']:7.2f} ms/step "
              f"({r['batch_tok_s']:.0f} tok/s)" + (f"  steady ms/step b1 {p1['ms_per_step']:.2f}, b{a.batch} "
                                                  f"{pb['ms_per_step']:.2f}" if p1 else "")
              + f"  tokens = first row's: {r['same_tokens_as_row0']}  ({time.perf_counter() - t:.0f} s)", flush=True)
        if pb.get("host"):
            print(f"{'':16s} host ms/step b1 {p1['host']['host_ms']:.3f}, b{a.batch} {pb['host']['host_ms']:.3f} "
                  f"({host_parts(pb['host'])}); graphs {pb['graph_bytes'] / 2**20:.0f} MiB, "
                  f"captured in {pb['capture_s']:.1f} s")
        free()
    host256 = {}
    if device == "cuda" and a.host_batch:                      # before / after the host fast path, at 256 running
        big = [[rng.randrange(cfg.vocab_size) for _ in range(a.prompt_len + i % 16)] for i in range(a.host_batch)]
        c256 = make_config(cfg, device, dtype, num_gpu_blocks_override=a.host_batch * (-(-(ctx + 16) // 16)) + 64,
                           max_num_seqs=a.host_batch, max_model_len=min(cfg.max_position_embeddings, 4096))
        for label, fast in HOST_ROWS:                          # unprofiled ms per step
            run(make(model, c256, fast), big, 2)               # compile and capture, not timed
            free()
            host256[label] = dict(ms_per_step=steady_time(model, c256, fast, big, steps=32, host=False)["ms_per_step"])
            free()
        for label, h in host_ab(model, c256, HOST_ROWS, big).items():   # host time, the rows interleaved
            host256[label]["host"] = h
            print(f"batch {a.host_batch}, {label}: {host256[label]['ms_per_step']:.2f} ms/step ({h['mode']}), host "
                  f"{h['host_ms']:.3f} ms/step median of {h['steps']} interleaved steps (mean {h['host_ms_mean']:.3f}; "
                  f"{host_parts(h)})", flush=True)
        free()
    hf = None
    if not a.skip_hf:
        hf = hf_ms_per_token(path, prompts[0], a.new, device)
        print(f"HF generate    single {hf:7.2f} ms/token")
    if device == "cuda":                                       # the profiler last (see steady_kernels)
        for r in rows:
            fast = dict(ROWS)[r["row"]]
            for key, ps in (("profile_1", prompts[:1]), ("profile_b", prompts)):
                k = steady_kernels(model, config, fast, ps)
                k["busy_pct"] = 100 * k["gpu_busy_ms"] / r[key]["ms_per_step"]
                r[key].update(k)
            p1, pb = r["profile_1"], r["profile_b"]
            print(f"{r['row']:16s} b1: {p1['kernels']:.0f} kernels, {p1['launch_calls']:.0f} launch calls, GPU busy "
                  f"{p1['gpu_busy_ms']:.2f} ms = {p1['busy_pct']:.0f}%  | b{a.batch}: {pb['kernels']:.0f} kernels, "
                  f"{pb['launch_calls']:.0f} calls, busy {pb['gpu_busy_ms']:.2f} ms = {pb['busy_pct']:.0f}%", flush=True)
        for label, fast in HOST_ROWS if host256 else ():
            k = steady_kernels(model, c256, fast, big)
            host256[label].update(k, busy_pct=100 * k["gpu_busy_ms"] / host256[label]["ms_per_step"])
            print(f"batch {a.host_batch}, {label}: GPU busy {host256[label]['busy_pct']:.0f}%", flush=True)
    for r in rows:
        for key in ("profile_1", "profile_b"):
            if r.get(key, {}).get("top"):
                print(f"top kernels, {r['row']}, {key}: " + "; ".join(f"{n} x{c:.0f} {t:.3f} ms" for n, c, t in r[key]["top"][:8]))
    meta = dict(device=name, torch=torch.__version__, triton=__import__("triton").__version__,
                transformers=__import__("transformers").__version__, model=model_name, dtype=str(dtype)[6:],
                copy_GBps=bw, matmul_TFLOPs=tf, prompt_len=a.prompt_len, new=a.new, batch=a.batch,
                batch_new=a.batch_new, hf_single_ms=hf, host_batch=a.host_batch, host256=host256,
                floor_single_ms=floor_ms(cfg, 1, a.prompt_len + a.new // 2, bw) if bw else None,
                floor_batch_ms=floor_ms(cfg, a.batch, a.prompt_len + a.batch_new // 2, bw) if bw else None)
    md = markdown(meta, rows)
    print("\n" + md)
    with open(os.path.join(a.out, "bench_l7.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(os.path.join(a.out, "bench_l7.md"), "w") as f:
        f.write(md + "\n")
    plot(os.path.join(a.out, "bench_l7.png"), meta, rows)
    print(f"wrote {a.out}/bench_l7.json, .md, .png; total {time.perf_counter() - t_start:.0f} s")


def markdown(meta, rows) -> str:
    b = meta["batch"]
    head = (f"Device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}; model {meta['model']} "
            f"({meta['dtype']}). Single stream: {meta['prompt_len']}-token prompt, {meta['new']} new tokens; batch {b}: "
            f"{meta['batch_new']} new tokens each. "
            + (f"Copy bandwidth measured here {meta['copy_GBps']:.0f} GB/s; decode floor {meta['floor_single_ms']:.3f} ms "
               f"(batch 1), {meta['floor_batch_ms']:.3f} ms (batch {b})." if meta["copy_GBps"] else "CPU: no roofline.")
            + (f" Peer: transformers `generate`, single stream, {meta['hf_single_ms']:.2f} ms/token." if meta["hf_single_ms"] else ""))
    lines = [head, "", f"| row | ms/token (1 stream) | % roofline | ms/step (batch {b}) | tok/s (batch {b}) | % roofline | "
             f"kernels/step b1 | launch calls b1 | GPU busy b1 | kernels/step b{b} | launch calls b{b} | GPU busy b{b} | "
             f"steady ms/step b1 | steady ms/step b{b} | host ms/step b{b} | graph MiB | tokens = stage 6 |",
             "|---|" + "---:|" * 15 + "---|"]
    for r in rows:
        p1, pb = r.get("profile_1"), r.get("profile_b")
        f = (lambda p, k, fmt: format(p[k], fmt) if p else "—")
        pct = (lambda k: f"{r[k]:.0f}%" if k in r else "—")
        host = pb["host"]["host_ms"] if pb and pb.get("host") else "—"
        graph = f"{pb['graph_bytes'] / 2**20:.0f}" if pb and pb.get("graph_bytes") else "—"
        lines.append(f"| {r['row']} | {r['single_ms']:.2f} | {pct('single_roofline_pct')} | {r['batch_ms']:.2f} | "
                     f"{r['batch_tok_s']:.0f} | {pct('batch_roofline_pct')} | {f(p1, 'kernels', '.0f')} | "
                     f"{f(p1, 'launch_calls', '.0f')} | {f(p1, 'busy_pct', '.0f')}% | {f(pb, 'kernels', '.0f')} | "
                     f"{f(pb, 'launch_calls', '.0f')} | {f(pb, 'busy_pct', '.0f')}% | {f(p1, 'ms_per_step', '.2f')} | "
                     f"{f(pb, 'ms_per_step', '.2f')} | {host} | {graph} | {r['same_tokens_as_row0']} |")
    if meta.get("host256"):
        n = meta["host_batch"]
        lines += ["", f"At {n} running requests (prompts of {meta['prompt_len']}..{meta['prompt_len'] + 15} tokens), "
                  "steady decode steps:", "",
                  "| row | ms/step | host ms/step (median) | schedule | inputs | advance | stats | sample | GPU busy |",
                  "|---|" + "---:|" * 8]
        for label, h in meta["host256"].items():
            p = h["host"]
            lines.append(f"| {label} | {h['ms_per_step']:.2f} | {p['host_ms']:.3f} | "
                         + " | ".join(f"{p.get(k, 0):.3f}" for k in ("schedule_ms", "inputs_ms", "advance_ms", "stats_ms",
                                                                     "sample_ms"))
                         + (f" | {h['busy_pct']:.0f}% |" if "busy_pct" in h else " | — |"))
    return "\n".join(lines)


def plot(path, meta, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(rows))
    labels = [r["row"].replace("+ ", "+\n") for r in rows]
    a.bar(x, [r["single_ms"] for r in rows], color="C0")
    if meta.get("hf_single_ms"):
        a.axhline(meta["hf_single_ms"], color="C1", ls="--", label="HF generate")
    if meta.get("floor_single_ms"):
        a.axhline(meta["floor_single_ms"], color="k", ls=":", label="roofline floor")
    a.set_yscale("log")
    a.set_xticks(x, labels, fontsize=8)
    a.set_ylabel("ms per token (log)")
    a.set_title(f"single stream, {meta['prompt_len']}-token prompt")
    a.legend(fontsize=8)
    b.bar(x, [r["batch_tok_s"] for r in rows], color="C2")
    b.set_xticks(x, labels, fontsize=8)
    b.set_ylabel("output tokens / s")
    b.set_title(f"batch {meta['batch']} decode")
    fig.suptitle(f"{meta['model']}, {meta['dtype']}, {meta['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
