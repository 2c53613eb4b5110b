"""The chain check: Hugging Face transformers' greedy generate() against every stage built so far.

    python scripts/check_chain.py                                   # tiny Qwen3, float32, CPU
    python scripts/check_chain.py --model Qwen/Qwen3-0.6B --device cuda --dtype bfloat16

For each stage: are its token ids identical to the oracle's, where do they first differ, and how
far apart are the next-token logits (max |diff| over the steps before any divergence). Exits 1
on any token mismatch. In bfloat16 two correct paths can pick different tokens where the
oracle's top-1 margin is within rounding; the table shows that margin at the first difference.
"""
from __future__ import annotations

import sys
import time

from plumbing.cli import base_parser, note, run_main
from harness.smoke import load


def print_refusals(refused: dict, skipped: dict, w: int) -> None:
    for name in refused:
        print(f"| {name:<{w}} | refused: the checkpoint has sliding windows, this stage does not implement them |")
    for name, why in skipped.items():
        print(f"| {name:<{w}} | skipped: {why} |")


def name_width(*names) -> int:
    """The stage column: 18 wide, or the longest name the table shows (l12_tensor_parallel: 19)."""
    return max([18, *(len(n) for group in names for n in group)])


def print_table(results: dict, w: int) -> None:
    print(f"| {'stage':<{w}} | tokens identical | first diff | max abs logit diff | margin at diff |")
    print(f"|{'-' * (w + 2)}|------------------|------------|--------------------|----------------|")
    for name, (gen, c) in results.items():
        first = "-" if c["first_diff"] is None else str(c["first_diff"])
        margin = "-" if c["margin_at_diff"] is None else f"{c['margin_at_diff']:.3g}"
        print(f"| {name:<{w}} | {'yes' if c['identical'] else 'NO':<16} | {first:>10} | "
              f"{c['max_logit_diff']:>18.3e} | {margin:>14} |")


def fp8_line(ref, ld, n, args, seconds) -> dict:
    """Stage 9 with an fp8 KV cache on the same workload: lossy by design, so compared, not judged."""
    from harness.stages import FP8_LINE
    from harness.oracle import compare
    name, make, generate = FP8_LINE
    t0 = time.perf_counter()
    cfg = ld.model.cfg
    gen = generate(make(ld.model, n), ld.prompt_ids, args.max_new_tokens, cfg.eos_token_ids,
                   cfg.max_position_embeddings)
    seconds[name] = time.perf_counter() - t0
    return compare(ref, gen)


def print_fp8_line(c: dict, margins: list) -> None:
    """The fp8 KV cache cannot be token-exact: its line says how far it agrees, and claims nothing."""
    upto = len(margins) if c["first_diff"] is None else c["first_diff"]
    where = "all of them" if c["first_diff"] is None else \
        f"first differs at step {c['first_diff']}, where the oracle's top-1 margin is {c['margin_at_diff']:.3g}"
    print(f"l9_fp8_kv[fp8] (agreement, not identity): oracle's tokens for {upto} of {len(margins)} steps "
          f"({where}); max abs logit diff before it {c['max_logit_diff']:.3g}")


def run_rows(stages, ld, args, ref, seconds) -> tuple[dict, dict, dict]:
    """Each stage's generation on the prompt, compared with the oracle's ``ref``: (results, refused,
    skipped); each row's seconds go into ``seconds``."""
    from harness.oracle import compare
    from harness.stages import Skipped
    from l1_dense.checkpoint import resolve_model_dir
    from plumbing.errors import WindowsUnsupported
    n, cfg = len(ld.prompt_ids) + args.max_new_tokens, ld.model.cfg
    eos, ctx = cfg.eos_token_ids, cfg.max_position_embeddings
    results, refused, skipped = {}, {}, {}
    for s in stages:                         # progress on stderr: the Triton rows are slow on a CPU
        t0 = time.perf_counter()
        try:
            gen = s.generate(s.engine(ld.model, n, resolve_model_dir(args.model)), ld.prompt_ids,
                             args.max_new_tokens, eos, ctx)
        except WindowsUnsupported as e:      # stages 1-7 and 13 refuse a windowed checkpoint, as they must
            refused[s.name] = str(e)
            print(f"  ... {s.name}: refused ({str(e)[:80]}...)", file=sys.stderr, flush=True)
            continue
        except Skipped as e:                 # stage 12 on a machine with one GPU
            skipped[s.name] = str(e)
            print(f"  ... {s.name}: skipped ({e})", file=sys.stderr, flush=True)
            continue
        seconds[s.name] = time.perf_counter() - t0
        print(f"  ... {s.name}: {seconds[s.name]:.1f} s", file=sys.stderr, flush=True)
        results[s.name] = (gen, compare(ref, gen))
    return results, refused, skipped


def main(argv=None) -> int:
    p = base_parser("check_chain", __doc__)
    p.add_argument("--no-fp8-line", action="store_true",
                   help="skip the l9_fp8_kv[fp8] line (its agreement with the oracle: reported, not a verdict)")
    p.add_argument("--stages", default=None,
                   help="comma-separated subset of stages to run, e.g. 'l1_dense,l5_scheduler' "
                        "(default: all; an unknown name lists them)")
    args = p.parse_args(argv)                # a bad flag stops here, before torch loads
    from harness.oracle import hf_generate
    from harness.stages import select
    from l1_dense.checkpoint import resolve_model_dir
    from l1_dense.generate import check_prompt
    stages = select(args.stages)             # unknown names fail here, before the model loads
    if args.json:
        note("--json is ignored by check_chain.py: it prints a table and a verdict (the smoke scripts take --json).")
    ld = load(args)
    check_prompt(ld.prompt_ids, args.max_new_tokens, ld.model.cfg)
    t0 = time.perf_counter()
    ref = hf_generate(resolve_model_dir(args.model), ld.prompt_ids, args.max_new_tokens,
                      ld.device, next(ld.model.parameters()).dtype)
    seconds = {"oracle": time.perf_counter() - t0}
    results, refused, skipped = run_rows(stages, ld, args, ref, seconds)
    n = len(ld.prompt_ids) + args.max_new_tokens
    fp8 = fp8_line(ref, ld, n, args, seconds) if "l9_fp8_kv" in results and not args.no_fp8_line else None

    margins = [float(t.topk(2).values[0] - t.topk(2).values[1]) for t in ref.logits]
    print(f"model={ld.label} device={ld.device} dtype={ld.dtype_name} prompt_len={len(ld.prompt_ids)} "
          f"new_tokens={len(ref.token_ids)} (oracle finish: {ref.finish_reason})")
    print(f"oracle (HF generate) : {ref.token_ids}")
    print(f"oracle top-1 margin  : min {min(margins):.4g} over the {len(margins)} steps")
    print()
    w = name_width(results, refused, skipped)
    print_table(results, w)
    print_refusals(refused, skipped, w)
    if fp8 is not None:
        print_fp8_line(fp8, margins)
    bad = [n for n, (_, c) in results.items() if not c["identical"]]
    print()
    print("time (s)   : " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    if not results:                          # every row refused or skipped: never say OK over nothing
        print("chain: NOTHING COMPARED, 0 stages ran")
        return 1
    if bad:
        print(f"chain: MISMATCH in {', '.join(bad)}")
        return 1
    print(f"chain: OK, {len(results)} stage(s) emit the oracle's {len(ref.token_ids)} tokens exactly"
          + (f"; {len(refused)} refused the windowed checkpoint, as they must" if refused else "")
          + (f"; {len(skipped)} skipped ({', '.join(skipped)}: see the table)" if skipped else ""))
    return 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
