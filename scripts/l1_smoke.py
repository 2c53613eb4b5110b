"""Stage 1 smoke test: greedy generation on a dense per-sequence KV cache.

    python scripts/l1_smoke.py                      # built-in tiny Qwen3 on CPU
    python scripts/l1_smoke.py --model Qwen/Qwen3-0.6B --device cuda
"""

from plumbing.cli import Watch, base_parser, positive_or_none, report, run_main
from harness.smoke import load


def main(argv=None):
    p = base_parser("l1_dense", __doc__)
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="rows preallocated in the dense cache (default: the model's context, at most 4096)")
    args = p.parse_args(argv)
    positive_or_none("--max-seq-len", args.max_seq_len)      # before torch loads
    from l1_dense.dense_kv import DenseEngine, default_max_seq_len
    from l1_dense.generate import check_prompt, greedy_generate
    ld = load(args)
    cfg = ld.model.cfg
    max_seq_len = args.max_seq_len or default_max_seq_len(cfg)
    check_prompt(ld.prompt_ids, args.max_new_tokens, cfg, max_seq_len, "--max-seq-len")
    engine = DenseEngine(ld.model, max_seq_len)
    watch = Watch(engine, args.max_new_tokens, quiet=args.json)
    gen = greedy_generate(watch, ld.prompt_ids, args.max_new_tokens, cfg.eos_token_ids)
    time_line, timing = watch.timing(len(gen.token_ids))
    mib = engine.kv.nbytes / 2**20
    report("l1_dense", ld, gen.token_ids, args.json,
           extra={"finish_reason": gen.finish_reason, "kv_reserved_bytes": engine.kv.nbytes, **timing},
           lines=[f"finish     : {gen.finish_reason}", time_line,
                  f"kv memory  : {mib:.2f} MiB reserved up front for max_seq_len={max_seq_len} "
                  f"(holds {engine.cur_len} tokens)"])


if __name__ == "__main__":
    run_main(main)
