"""Nothing compiles after start-up: stage 7 served from a Triton cache that start-up alone filled.

    python scripts/check_no_compile.py                      # GPU: tiny Qwen3, bf16, a fresh cache
    python scripts/check_no_compile.py --model qwen3-0.6b   # the real shape, random weights
    python scripts/check_no_compile.py --plant              # a variant start-up cannot see: exits 1
    python scripts/check_no_compile.py --stage l8_sliding_window --model tiny-qwen2-hybrid
    python scripts/check_no_compile.py --stage l9_fp8_kv --kv-cache-dtype fp8 --model tiny-qwen2-hybrid

The script points TRITON_CACHE_DIR at an empty directory (a new temporary one, or --cache-dir)
before Triton loads, builds l7_fast's ``LLM`` (whose start-up compiles every kernel variant the
engine can launch, l7_fast/warmup.py), notes the cache's entries, and then serves a varied
workload: every prompt length class alone (chunked past the budget), batches whose running count
walks down through every graph bucket, a long prompt chunked in beside decodes, prefix-cache hits,
greedy and sampled. Every cache entry written after start-up is a compile a request waited for:
the script lists each with the kernels it holds and exits 1. Exit 0 prints "nothing compiled
after start-up". ``--plant`` swaps in a tile choice for steps of exactly 3 sequences, which the
start-up plan never probes: the check must catch it (tests/test_l7_warmup.py runs both).

Needs a CUDA device: the Triton interpreter (CPU) compiles nothing. On the CPU,
tests/test_l7_warmup.py checks the same property by recording each launch's variant.
"""
from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import sys
import tempfile
import time


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("tiny-qwen3", "tiny-mistral", "tiny-qwen2-hybrid", "qwen3-0.6b"),
                    default="tiny-qwen3", help="a tiny checkpoint of the project's (the windowed ones need "
                    "--stage l8_sliding_window) or qwen3-0.6b (random weights, real shape)")
    ap.add_argument("--stage", choices=("l7_fast", "l8_sliding_window", "l9_fp8_kv"), default="l7_fast",
                    help="whose LLM serves (default l7_fast; l8_sliding_window also launches the windowed kernels, "
                         "l9_fp8_kv with --kv-cache-dtype fp8 the e4m3 ones)")
    ap.add_argument("--kv-cache-dtype", choices=("fp8", "fp8_per_token_head"), default=None,
                    help="stage 9's KV cache (needs --stage l9_fp8_kv)")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--cache-dir", default=None, help="the Triton cache to use; must be empty or absent "
                                                      "(default: a new temporary directory)")
    ap.add_argument("--out", default="out/check_no_compile", help="where the qwen3-0.6b checkpoint is built")
    ap.add_argument("--num-gpu-blocks", type=int, default=None,
                    help="KV pool size in blocks (LLM's num_gpu_blocks_override; default: 90%% of free GPU memory); "
                         "the tests pass a small pool so that the check runs beside other GPU tests")
    ap.add_argument("--plant", action="store_true", help="plant a tile choice start-up cannot see (must fail)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.kv_cache_dtype and a.stage != "l9_fp8_kv":
        ap.error("--kv-cache-dtype is stage 9's option: add --stage l9_fp8_kv")
    return a


def use_empty_cache(path: str | None) -> str:
    """Point Triton at an empty cache; before triton is imported (main imports it after this). A
    temporary one (no --cache-dir) is removed when the process exits, however it exits."""
    if path is None:
        path = tempfile.mkdtemp(prefix="triton-cache-")
        atexit.register(shutil.rmtree, path, True)
    if os.path.isdir(path) and os.listdir(path):
        sys.exit(f"--cache-dir {path} is not empty: give an empty or new directory (the check starts cold)")
    os.environ["TRITON_CACHE_DIR"] = path
    return path


def planted(pick):
    """``pick`` (stage 3's tile picker) with a planted variant: steps of exactly 3 sequences with a
    query longer than 1 get 32-key tiles, which no start-up shape (S = 1, or S = max_num_seqs) makes.
    tests/test_l7_warmup.py plants the same one on the CPU."""
    from l3_paged.kernel_config import KernelConfig

    def pick_planted(max_seqlen_q, num_tokens, num_seqs, *a):
        cfg = pick(max_seqlen_q, num_tokens, num_seqs, *a)
        return KernelConfig(cfg.block_q, 32, 2, 2) if num_seqs == 3 and max_seqlen_q > 1 else cfg
    return pick_planted


def batches(vocab: int, max_len: int, budget: int, max_seqs: int, seed: int):
    """(name, prompts, params) per generate call of the workload; prompt + output fit max_len."""
    from l4_sampler.params import SamplingParams
    rng = random.Random(seed)
    top = max_len - 40
    ids = lambda n: [rng.randrange(vocab) for _ in range(n)]                       # noqa: E731
    lengths = sorted({n for n in (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256,
                                  257, 511, 1000, 2047, 2048, 2049, 4095, 4097, budget - 1, budget, budget + 1,
                                  2 * budget + 3) if 1 <= n <= top})
    greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for n in lengths:                                             # prefill tiles; chunked past the budget
        yield f"a {n}-token prompt alone", [ids(n)], greedy
    sizes = [n for n in (2, 3, 5, 9, 17, 33, 65, 129, 255, 256) if n <= max_seqs]
    for n in sizes:                                               # outputs 1..40: the running count walks down
        prompts = [ids(rng.choice([1, 5, 20, 70, min(top, 300)])) for _ in range(n)]
        params = [SamplingParams(temperature=rng.choice([0, 0.8]), top_p=0.9, top_k=20, max_tokens=rng.randint(1, 40),
                                 seed=i, ignore_eos=True) for i in range(n)]
        yield f"{n} requests at once", prompts, params
    long = ids(min(top, 3 * budget))
    shorts = [ids(rng.randint(1, 30)) for _ in range(min(max_seqs, 64) - 1)]
    yield "a long prompt chunked in beside decodes", shorts + [long], \
        [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * len(shorts) + [greedy]
    yield "prefix-cache hits: the long prompt again, plus a few tokens", [long[:len(long) - 9] + ids(5), long], greedy


def new_kernels(cache: str, before: set) -> list[str]:
    from l7_fast.warmup import cache_entries
    out = []
    for entry in sorted(cache_entries(cache) - before):
        names = sorted({f.split(".")[0].replace("__grp__", "") for f in os.listdir(os.path.join(cache, entry))})
        out.append(f"{entry[:12]}...: {', '.join(names)}")
    return out


def main(argv=None) -> int:
    a = parse(argv)                                       # a bad flag stops here, before torch loads
    wanted = use_empty_cache(a.cache_dir)
    import torch
    import plumbing.runtime  # noqa: F401  (before triton: picks GPU or interpreter; stage packages import lazily)
    from l7_fast.warmup import cache_entries, triton_cache_dir
    if not torch.cuda.is_available():
        print("check_no_compile needs a CUDA device: the Triton interpreter (CPU) compiles nothing. "
              "On the CPU, pytest tests/test_l7_warmup.py checks that start-up launches every variant.")
        return 2
    if a.plant:
        import l3_paged.attention_triton as attention
        attention.pick_config = planted(attention.pick_config)
    import importlib
    LLM = importlib.import_module(a.stage).LLM
    if a.model.startswith("tiny-"):
        from plumbing.tiny import tiny_checkpoint
        path = str(tiny_checkpoint(a.model[len("tiny-"):]))
    else:
        from harness.random_checkpoint import build_checkpoint
        path = build_checkpoint(os.path.join(a.out, "qwen3-0.6b-random"))
    cache = triton_cache_dir()
    if os.path.abspath(cache) != os.path.abspath(wanted):
        sys.exit(f"Triton uses the cache {cache}, not {wanted}: was triton imported before this script set it?")
    t0 = time.perf_counter()
    kv = dict(kv_cache_dtype=a.kv_cache_dtype) if a.kv_cache_dtype else {}
    llm = LLM(path, device="cuda", dtype=a.dtype, seed=a.seed, num_gpu_blocks_override=a.num_gpu_blocks, **kv)
    print(f"start-up: {time.perf_counter() - t0:.1f} s ({a.stage}, {a.model}, {a.dtype}, Triton cache {cache}: "
          f"{len(cache_entries(cache))} entries after start-up)")
    before = cache_entries(cache)
    c, V = llm.llm_engine.config, llm.model.cfg.vocab_size
    bad = []
    for name, prompts, params in batches(V, c.max_model_len, c.max_num_batched_tokens, c.max_num_seqs, a.seed):
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        compiled = new_kernels(cache, before)
        print(f"  {name}: {len(prompts)} prompts, {time.perf_counter() - t:.2f} s, "
              f"{len(compiled) - len(bad)} new cache entries")
        bad = compiled
    if bad:
        print(f"FAIL: {len(bad)} cache entries compiled after start-up (each a wait in the serving path):")
        print("\n".join("  " + b for b in bad))
        return 1
    print(f"OK: nothing compiled after start-up ({len(before)} cache entries, all written by start-up)")
    return 0


if __name__ == "__main__":
    from plumbing.cli import run_main
    run_main(lambda: sys.exit(main(sys.argv[1:])))
