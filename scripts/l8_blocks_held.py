"""Blocks held against sequence length, stage 8's engine: a windowed group's stay flat, a full group's grow.

    python scripts/l8_blocks_held.py                     # tiny-mistral and tiny-qwen2-hybrid, 160 new tokens
    python scripts/l8_blocks_held.py --max-tokens 60 --out /tmp/held

One request decodes on each checkpoint; after every step the script reads, per KV cache group,
how many blocks the request holds and the KV bytes they are, and compares with what the same
request would hold if no block were ever freed (every group keeps its history: what stage 7's
design holds; stage 7 itself refuses windowed checkpoints, so this peer is counted from the same
run's block tables, not measured by another engine). Prints a table, saves JSON and a PNG
(out/l8_blocks_held.{json,png} unless --out says where; lesson 8's figure, docs/l8_blocks_held.png,
is this default run's). Runs on the CPU (the Triton interpreter) or a GPU; the counts do not depend
on the device.
"""
import argparse
import json
import math
import os
import sys
import time

from plumbing.cli import run_main
from plumbing.plot import pyplot, wrote

PROMPT = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]


def measure(model: str, max_tokens: int, block_size: int) -> dict:
    from l8_sliding_window import LLM, SamplingParams
    llm = LLM(model, dtype="float32", block_size=block_size, num_gpu_blocks_override=256)
    engine = llm.llm_engine
    kv, cache = engine.scheduler.kv, engine.runner.cache
    layer_bytes = cache.bytes_per_block // len(cache.groups[0].layers)     # one layer's block, K and V
    engine.add(engine.make_request({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                                 ignore_eos=True)))
    rows = []
    while engine.has_unfinished_requests():
        engine.step()
        for req in engine.scheduler.running:
            held = [kv.held(req.kv, g) for g in range(len(kv.windows))]
            kept = len(req.kv.blocks)
            rows.append(dict(seq_len=req.kv.cur_len, held=held,
                             bytes=sum(h * len(g.layers) * layer_bytes for h, g in zip(held, cache.groups)),
                             no_freeing_bytes=sum(kept * len(g.layers) * layer_bytes for g in cache.groups)))
    bounds = [None if W is None else math.ceil(W / block_size) + 1 for W in kv.windows]
    return dict(model=model, block_size=block_size, windows=list(kv.windows), layers=[list(g.layers) for g in cache.groups],
                bound=bounds, rows=rows)


def check(run: dict) -> list[str]:
    """Windowed groups within their bound, full groups = the whole history: the figures' claims."""
    bad = []
    for r in run["rows"]:
        for g, (h, b) in enumerate(zip(r["held"], run["bound"])):
            if b is not None and h > b or b is None and h != math.ceil(r["seq_len"] / run["block_size"]):
                bad.append(f"{run['model']} len {r['seq_len']} group {g}: {h} blocks (bound {b})")
    return bad


def plot(runs: list[dict], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4))
    for ax, run in zip(axes if len(runs) > 1 else [axes], runs):
        xs = [r["seq_len"] for r in run["rows"]]
        ax.plot(xs, [r["bytes"] / 1024 for r in run["rows"]], label="stage 8: dead blocks freed")
        ax.plot(xs, [r["no_freeing_bytes"] / 1024 for r in run["rows"]], "--", label="no block freed (stage 7's design)")
        ax.set(title=f"{run['model']}  windows {run['windows']}", xlabel="sequence length (tokens)",
               ylabel="KV held by the request (KiB)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", help="checkpoint (repeatable); default tiny-mistral and tiny-qwen2-hybrid")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--out", default="out/l8_blocks_held", help="path prefix for .json and .png (default: %(default)s)")
    args = p.parse_args(argv)
    if args.max_tokens < 1 or args.block_size < 1:
        p.error("--max-tokens and --block-size must be >= 1")
    t0, runs = time.perf_counter(), []
    for m in args.model or ["tiny-mistral", "tiny-qwen2-hybrid"]:
        print(f"  ... {m}: one request, {len(PROMPT)} prompt + {args.max_tokens} new tokens", file=sys.stderr, flush=True)
        runs.append(measure(m, args.max_tokens, args.block_size))
    print(f"{'model':<20} {'seq len':>8}  {'blocks held per group':<24} {'KiB held':>9} {'KiB, no freeing':>16}")
    for run in runs:
        for r in run["rows"][::max(1, len(run["rows"]) // 8)] + run["rows"][-1:]:
            print(f"{run['model']:<20} {r['seq_len']:>8}  {str(r['held']):<24} {r['bytes'] / 1024:>9.1f} "
                  f"{r['no_freeing_bytes'] / 1024:>16.1f}")
    bad = [b for run in runs for b in check(run)]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(dict(block_size=args.block_size, dtype="float32", runs=runs, violations=bad), f, indent=1)
    plot(runs, args.out + ".png")
    print(f"bounds     : {'OK' if not bad else 'VIOLATED: ' + '; '.join(bad[:3])} "
          f"(windowed group <= ceil(W / block_size) + 1 blocks after every step; full group = the history)")
    print(f"saved      : {wrote(args.out + '.json', args.out + '.png').removeprefix('wrote ')} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
