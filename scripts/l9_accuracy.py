"""The fp8 KV cache against the oracle: how far its logits move from Hugging Face's, and whether
its greedy tokens stay HF's wherever HF is sure.

    python scripts/l9_accuracy.py                                  # 3 tiny checkpoints, CPU, all kv dtypes
    python scripts/l9_accuracy.py --models tiny-qwen3 --prompts 4 --max-new-tokens 16
    python scripts/l9_accuracy.py --random-qwen3-0.6b /tmp/q06b --device cuda --dtype bfloat16

fp8 cannot be token-exact, so the oracle is teacher-forced along the engine's own output. Stage 9
generates greedily (a batch of random prompts, ``ignore_eos``) and keeps each step's logits; HF
(its own KV dtype, the model's) then reads prompt + those tokens in one forward, so at every
position both saw the same context. Per position: |logit diff| (all vocabulary), whether the two
top-1 tokens agree, and HF's top-1 margin. If |diff| <= d everywhere, a margin above 2 d cannot
flip the top-1: so the claim checked is that every disagreement sits where HF's margin is at most
``--margin-bound`` (stated up front, default 1.0 logit). Exit 1 on any disagreement above it, or
if fewer positions than asked were compared. ``auto`` (stage 8) is the row to read the others by.
Prints a table and saves JSON (``--out``).
"""
import argparse
import json
import random
import sys
import time

from plumbing.cli import DTYPE_NAMES, note, run_main

KV_DTYPES = ("auto", "fp8", "fp8_per_token_head")
TINY = ("tiny-qwen3", "tiny-llama", "tiny-qwen2")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(TINY), help=f"comma-separated (default: {','.join(TINY)})")
    p.add_argument("--random-qwen3-0.6b", dest="random_qwen", default=None, metavar="DIR",
                   help="also a random-weight Qwen3-0.6B built in DIR (a GPU run)")
    p.add_argument("--kv-cache-dtypes", default=",".join(KV_DTYPES))
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=48, help="prompt lengths are drawn from [len/2, len]")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--margin-bound", type=float, default=1.0)
    p.add_argument("--impl", default="triton", choices=("triton", "torch"),
                   help="torch: the reference path (torch ops, quantize_kv, the attention reference): fast on a CPU")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, choices=DTYPE_NAMES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON path (default: none)")
    a = p.parse_args(argv)
    bad = [k for k in a.kv_cache_dtypes.split(",") if k not in KV_DTYPES]
    if bad or a.prompts < 1 or a.max_new_tokens < 1 or a.prompt_len < 2 or not a.margin_bound > 0:
        p.error(f"kv dtypes must be among {KV_DTYPES} (got {bad}); --prompts, --max-new-tokens >= 1, "
                "--prompt-len >= 2, --margin-bound > 0")
    return a


def engine_run(model, kv_dtype, prompts, args):
    """Greedy tokens and the logits of every step, from stage 9's engine."""
    from l9_fp8_kv import LLM, SamplingParams
    torch_path = dict(fused_ops=False) if args.impl == "torch" else {}          # the reference: torch ops, torch attention
    llm = LLM(model, kv_cache_dtype=kv_dtype, keep_logits=True, impl=args.impl, device=args.device, dtype=args.dtype,
              **torch_path)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=True)
    engine = llm.llm_engine                   # the engine's own loop: its requests keep their logits
    ids = [engine.add_request({"prompt_token_ids": p}, sp) for p in prompts]
    while engine.has_unfinished_requests():
        engine.step()
    runs = [(engine.requests[i].output_ids, engine.requests[i].logits) for i in ids]
    blocks = engine.scheduler.kv.num_blocks
    del llm, engine                           # the next engine takes the GPU's free memory for its pool: free this one's
    import gc
    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return runs, blocks


def compare(hf, prompts, runs, bound):
    import torch
    diffs, agree, over, margins_at = [], 0, 0, []
    for prompt, (tokens, logits) in zip(prompts, runs):
        seq = torch.tensor([prompt + tokens[:-1]], device=hf.device)
        with torch.no_grad():
            ref = hf(seq).logits[0, len(prompt) - 1:].float().cpu()            # [new tokens, V]
        ours = torch.stack(logits)
        diffs.append((ours - ref).abs().amax(-1))
        top2 = ref.topk(2, -1).values
        margin = top2[:, 0] - top2[:, 1]
        same = ours.argmax(-1) == ref.argmax(-1)
        agree += int(same.sum())
        over += int((~same & (margin > bound)).sum())
        margins_at += margin[~same].tolist()
    d = torch.cat(diffs)
    return dict(positions=d.numel(), max_diff=float(d.max()), mean_diff=float(d.mean()), top1_agree=agree / d.numel(),
                disagreements=d.numel() - agree, above_bound=over,
                largest_margin_flipped=max(margins_at, default=None))


def run(args) -> int:
    from harness.oracle import hf_model
    from l1_dense.checkpoint import resolve_model_dir
    from plumbing.cli import dtype_name_of, torch_dtype
    from plumbing.runtime import default_device, default_dtype
    device = args.device or default_device()
    dtype = args.dtype or dtype_name_of(default_dtype(device))
    models = [m for m in args.models.split(",") if m]
    if args.random_qwen:
        from harness.random_checkpoint import build_checkpoint
        models.append(build_checkpoint(args.random_qwen))
    rows, t_all = [], time.perf_counter()
    for model in models:
        hf = hf_model(resolve_model_dir(model), device, torch_dtype(dtype))
        rng = random.Random(args.seed)
        vocab = hf.config.vocab_size
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(args.prompt_len // 2, args.prompt_len))]
                   for _ in range(args.prompts)]
        for kv_dtype in args.kv_cache_dtypes.split(","):
            t0 = time.perf_counter()
            runs, blocks = engine_run(model, kv_dtype, prompts, args)
            r = dict(model=model, kv_cache_dtype=kv_dtype, pool_blocks=blocks, **compare(hf, prompts, runs,
                                                                                       args.margin_bound))
            r["seconds"] = time.perf_counter() - t0
            rows.append(r)
            print(f"  ... {model} {kv_dtype}: {r['positions']} positions, {r['seconds']:.1f} s", file=sys.stderr,
                  flush=True)
        del hf
    print(f"device={device} dtype={dtype} impl={args.impl} prompts={args.prompts} new_tokens={args.max_new_tokens} "
          f"margin bound={args.margin_bound} (a top-1 flip with HF's margin above it fails the check)")
    print("| model | kv cache | pool blocks | positions | max abs logit diff | mean | top-1 agree | flips | "
          "flips above bound | largest margin flipped |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        lm = "-" if r["largest_margin_flipped"] is None else f"{r['largest_margin_flipped']:.3g}"
        print(f"| {r['model'].split('/')[-1]} | {r['kv_cache_dtype']} | {r['pool_blocks']} | {r['positions']} | "
              f"{r['max_diff']:.3g} | {r['mean_diff']:.3g} | {100 * r['top1_agree']:.2f}% | {r['disagreements']} | "
              f"{r['above_bound']} | {lm} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=device, dtype=dtype, args=vars(args), rows=rows), f, indent=1)
    want = args.prompts * args.max_new_tokens
    short = [r for r in rows if r["positions"] != want]
    bad = [r for r in rows if r["above_bound"]]
    print(f"time: {time.perf_counter() - t_all:.1f} s")
    if short or not rows:
        print(f"accuracy: NOT CHECKED, {len(short)} run(s) compared fewer than {want} positions")
        return 1
    if bad:
        print("accuracy: FAIL, top-1 flips where HF's margin exceeds the bound in "
              + ", ".join(f"{r['model'].split('/')[-1]} {r['kv_cache_dtype']}" for r in bad))
        return 1
    print(f"accuracy: OK, {len(rows)} run(s) x {want} positions: every top-1 flip has HF's margin <= "
          f"{args.margin_bound}")
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    if args.device == "cpu" and args.random_qwen:
        note("--random-qwen3-0.6b on the CPU runs a 0.6B model through the Triton interpreter: hours.")
    return run(args)


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
