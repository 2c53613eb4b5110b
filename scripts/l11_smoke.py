"""Stage 11 smoke test: stage 9's run with speculative decoding (vLLM's ``speculative_config``).

    python scripts/l11_smoke.py                                         # n-gram lookup, 3 guesses a step
    python scripts/l11_smoke.py --speculative-method draft_model --draft-model tiny-llama
    python scripts/l11_smoke.py --speculative-method draft_model --draft-model tiny-qwen3   # itself: all kept
    python scripts/l11_smoke.py --num-speculative-tokens 5 --prompt-lookup-max 4

Greedy tokens must equal stage 9's (and transformers'): the guesses change how many tokens a step
emits, never which. Adds a ``speculation`` line: guesses verified and kept (the acceptance rate),
tokens per verify step, steps that guessed and steps where the pay-off rule switched it off.
Every l9_smoke flag works here.
"""
import functools

import _path  # noqa: F401
from l7_smoke import parser, run
from l9_smoke import KV_CACHE_DTYPES
from l9_smoke import observer as kv_observer
from plumbing.cli import run_main


def observer(engine):
    after, kv_lines, kv_extra = kv_observer(engine)
    spec = engine.speculator

    def extra():
        return dict(kv_extra(), spec_drafted=spec.drafted, spec_accepted=spec.accepted,
                    spec_verify_steps=spec.verify_steps, spec_off_steps=spec.off_steps)

    def lines():
        rate = spec.acceptance_rate()
        per = (spec.accepted + spec.verify_steps) / spec.verify_steps if spec.verify_steps else 0.0
        return kv_lines() + [f"speculation: {spec.drafted} guesses verified in {spec.verify_steps} steps, {spec.accepted} kept "
                             f"(acceptance {'-' if rate is None else f'{rate:.2f}'}); {per:.2f} tokens per verify "
                             f"step; {spec.off_steps} steps with speculation off (batch > {spec.disable_by_batch_size})"]
    return after, lines, extra


def main(argv=None):
    p = parser("l11_spec_decode", __doc__)
    p.add_argument_group("stage 9").add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                                                 help="as in l9_smoke.py")
    g = p.add_argument_group("stage 11")
    g.add_argument("--speculative-method", default="ngram", choices=("ngram", "draft_model"),
                   help="who guesses: n-gram prompt lookup (default) or a draft model")
    g.add_argument("--num-speculative-tokens", type=int, default=3, help="guesses per step, k (default 3)")
    g.add_argument("--prompt-lookup-min", type=int, default=1, help="ngram: shortest n-gram matched (default 1)")
    g.add_argument("--prompt-lookup-max", type=int, default=3, help="ngram: longest n-gram matched (default 3)")
    g.add_argument("--draft-model", default=None, help="draft_model: a checkpoint with the target's tokenizer")
    args = p.parse_args(argv)
    cfg = dict(method=args.speculative_method, num_speculative_tokens=args.num_speculative_tokens)
    if args.speculative_method == "ngram":
        cfg |= dict(prompt_lookup_min=args.prompt_lookup_min, prompt_lookup_max=args.prompt_lookup_max)
        if args.draft_model:
            p.error("--draft-model is given but ignored with --speculative-method ngram: drop it, or add "
                    "--speculative-method draft_model")
    else:
        cfg["model"] = args.draft_model or p.error("--speculative-method draft_model needs --draft-model PATH")
    from l11_spec_decode import build_engine
    run(args, "l11_spec_decode", functools.partial(build_engine, kv_cache_dtype=args.kv_cache_dtype,
                                                   speculative_config=cfg), observer)


if __name__ == "__main__":
    run_main(main)
