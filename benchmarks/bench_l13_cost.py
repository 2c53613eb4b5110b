"""What ``batch_invariant=True`` costs, end to end and one stream, against the same engine without it,
in the same process on the same GPU.

    python -m benchmarks.bench_l13_cost              # one GPU, bf16: ~5 minutes on a fresh machine
    python -m benchmarks.bench_l13_cost --quick      # CPU smoke test of the script (tiny model, 8 requests)

Model: a random-weight Qwen3-0.6B-shaped checkpoint (bf16) the script builds. Each mode gets a fresh
``l13_batch_invariant.LLM`` (CUDA graphs and async scheduling as shipped), a warm-up on other prompts,
then:
  e2e     nano-vllm's workload (bench_e2e's): 256 requests, prompt and output lengths uniform in
          [100, 1024], ignore_eos, greedy: output tokens / second; floor: bench_e2e's roofline over
          this run's own schedule (bytes of each step / copy bandwidth).
  single  one request, a 512-token prompt: ms per decoded token = (t(1 + 256 tokens) - t(1)) / 256;
          floor: the weights (lm_head once) / copy bandwidth.
Goals (issue 41): the invariant mode costs at most 10% e2e and 5% single stream. Writes
benchmarks/results/bench_l13_cost/<gpu>.{json,md,png} (--quick: out/).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

GOALS = dict(e2e=10.0, single=5.0)          # % the invariant mode may cost


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny model, 8 short requests: smoke-test the script")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--out", default=None, help="folder for bench_l13_cost.{json,md,png}")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only draw the .png beside a saved JSON (a GPU "
                                                                   "machine without matplotlib writes JSON and .md)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse(sys.argv[1:])

import torch  # noqa: E402

import plumbing.runtime  # noqa: E402,F401
from benchmarks.bench_common import bench_device, ceilings, free, sync, workload  # noqa: E402
from benchmarks.bench_e2e import run_ours  # noqa: E402
from benchmarks.bench_e2e_report import roofline  # noqa: E402
from benchmarks.outputs import output_stem, save_results, scratch_dir  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import wrote  # noqa: E402

T0 = time.perf_counter()


def say(text: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {text}", flush=True)


def single_stream(llm, vocab: int, new: int) -> float:
    """ms per decoded token of one request (prompt 512): the difference of two runs cancels the prefill."""
    import random
    prompt = [random.Random(7).randrange(vocab) for _ in range(512)]

    def t(n):
        sync()
        s = time.perf_counter()
        run_ours(llm, [(prompt, n)])
        sync()
        return time.perf_counter() - s
    t(4)
    return min((t(1 + new) - t(1)) / new * 1e3 for _ in range(2))


def measure(path, device, dtype, invariant: bool, a, bw, tf) -> dict:
    from l13_batch_invariant import LLM
    sync()
    s = time.perf_counter()
    llm = LLM(path, device=device, dtype=dtype, batch_invariant=invariant)
    start = time.perf_counter() - s
    cfg = llm.model.cfg
    lo, hi = (4, 24) if a.quick else (100, 1024)
    warm = workload(16, lo, hi, cfg.vocab_size, 1) + ([([1] * 2100, 2)] if not a.quick else [])
    s = time.perf_counter()
    run_ours(llm, [(p, 4) for p, _ in warm])
    say(f"batch_invariant={invariant}: start-up {start:.1f} s, warm-up {time.perf_counter() - s:.1f} s")
    e2e, stats = run_ours(llm, workload(a.num_requests, lo, hi, cfg.vocab_size, 0))
    new = 16 if a.quick else 256
    ms = single_stream(llm, cfg.vocab_size, new)
    row = dict(batch_invariant=invariant, startup_s=start, e2e_tok_per_s=e2e["tok_per_s"], e2e_s=e2e["seconds"],
               steps=e2e["steps"], preemptions=e2e["preemptions"], single_ms_per_token=ms)
    if bw:
        row["e2e_floor_fraction"] = roofline(stats, cfg, bw, tf)["floor_memory_s"] / e2e["seconds"]
        weights = sum(p.numel() * p.element_size() for p in llm.model.parameters())
        row["single_floor_fraction"] = weights / (bw * 1e9) * 1e3 / ms     # bytes / copy rate, as the e2e floor
    say(f"batch_invariant={invariant}: e2e {row['e2e_tok_per_s']:,.0f} tok/s ({e2e['seconds']:.1f} s, {e2e['steps']} "
        f"steps), one stream {ms:.3f} ms/token")
    del llm
    free()
    return row


def markdown(meta, rows, cost) -> str:
    frac = lambda r, k: f"{100 * r[k]:.0f}%" if k in r else "-"          # noqa: E731
    lines = [f"# bench_l13_cost: {meta['device']}, {meta['dtype']}, {meta['model']}, torch {meta['torch']}, "
             f"triton {meta['triton']}", "",
             "| batch_invariant | e2e tok/s | e2e % of floor | one stream ms/token | one stream % of floor |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['batch_invariant']} | {r['e2e_tok_per_s']:,.0f} | {frac(r, 'e2e_floor_fraction')} | "
              f"{r['single_ms_per_token']:.3f} | {frac(r, 'single_floor_fraction')} |" for r in rows]
    lines += ["", f"cost of the option: e2e {cost['e2e']:+.1f}% (goal <= {GOALS['e2e']:.0f}%), one stream "
              f"{cost['single']:+.1f}% (goal <= {GOALS['single']:.0f}%)"]
    return "\n".join(lines)


def draw(rows):
    def go(plt, path):
        fig, ax = plt.subplots(1, 2, figsize=(8, 3.2))
        names = ["off", "on"]
        ax[0].bar(names, [r["e2e_tok_per_s"] for r in rows], color=["grey", "tab:blue"])
        ax[0].set_title("e2e output tok/s")
        ax[1].bar(names, [r["single_ms_per_token"] for r in rows], color=["grey", "tab:blue"])
        ax[1].set_title("one stream, ms/token")
        for x in ax:
            x.set_xlabel("batch_invariant")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    return go


def main(argv=None) -> None:
    a = parse(argv)
    if a.replot:
        from plumbing.plot import pyplot
        if a.quick or a.out or a.num_requests != 256:
            print("note: --quick, --out and --num-requests are ignored with --replot: it draws the PNG beside the JSON")
        import json
        plt, stem = pyplot(), os.path.splitext(a.replot)[0]
        if plt is not None:
            draw(json.load(open(a.replot))["rows"])(plt, stem + ".png")
        print(wrote(stem + ".png"))
        return
    device = bench_device(a.quick)
    import triton
    from harness.random_checkpoint import build_checkpoint
    from plumbing.tiny import tiny_checkpoint
    if a.quick:
        if a.num_requests != 256:
            print(f"note: --num-requests {a.num_requests} is ignored with --quick (8 short requests)")
        path, model, dtype, a.num_requests = str(tiny_checkpoint("qwen3")), "tiny-qwen3", torch.float32, 8
    else:
        path = build_checkpoint(os.path.join(scratch_dir("bench_l13_cost"), "qwen3-0.6b-random"), "Qwen/Qwen3-0.6B")
        model, dtype = "Qwen3-0.6B shape, random weights", torch.bfloat16
    bw, tf = ceilings(device)
    meta = dict(device=torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter)", dtype=str(dtype)[6:],
                model=model, torch=torch.__version__, triton=triton.__version__, copy_GBps=bw, matmul_TFLOPs=tf,
                num_requests=a.num_requests)
    say(f"{meta['device']}, {meta['dtype']}, {model}; copy {bw or 0:.0f} GB/s")
    rows = [measure(path, device, dtype, inv, a, bw, tf) for inv in (False, True)]
    off, on = rows
    cost = dict(e2e=100 * (off["e2e_tok_per_s"] / on["e2e_tok_per_s"] - 1),
                single=100 * (on["single_ms_per_token"] / off["single_ms_per_token"] - 1))
    text = markdown(meta, rows, cost)
    print(text)
    if a.quick:
        print("goals: not judged (--quick smoke-tests the script; its numbers are not a measurement)")
    else:
        print("goals: " + ", ".join(f"{k} {'met' if cost[k] <= GOALS[k] else 'NOT met'}" for k in GOALS))
    stem = output_stem("bench_l13_cost", a.out, a.quick, device)
    print(wrote(*save_results(stem, dict(meta=meta, rows=rows, cost_pct=cost, goals_pct=GOALS), text, draw(rows))))
    say("done")


if __name__ == "__main__":
    run_main(main)
