"""Stage 11 smoke test: stage 9's run with speculative decoding (vLLM's ``speculative_config``).

    python scripts/l11_smoke.py                                         # n-gram lookup, 3 guesses a step
    python scripts/l11_smoke.py --speculative-config '{"method": "draft_model", "model": "tiny-llama", "num_speculative_tokens": 3}'
    python scripts/l11_smoke.py --speculative-config '{"method": "draft_model", "model": "tiny-qwen3", "num_speculative_tokens": 3}'   # itself: all kept
    python scripts/l11_smoke.py --speculative-config '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}'

Greedy tokens must equal stage 9's (and transformers'): the guesses change how many tokens a step
emits, never which. Adds a ``speculation`` line: guesses verified and kept (the acceptance rate),
tokens per verify step, steps that guessed and steps where the pay-off rule switched it off.
Every l9_smoke flag works here.
"""
from l6_smoke import DEMO6
from l7_smoke import parser, run
from l9_smoke import observer as kv_observer
from plumbing.cli import run_main

#: the run's default: n-gram lookup of 1-3 tokens, 3 guesses a step (--speculative-config replaces it)
DEMO11 = dict(DEMO6, speculative_config=dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                                             prompt_lookup_max=3))


def observer(engine):
    after, kv_lines, kv_extra = kv_observer(engine)
    spec = engine.step_order.speculator

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
    args = parser("l11_spec_decode", __doc__, DEMO11).parse_args(argv)
    run(args, "l11_spec_decode", observer, DEMO11)


if __name__ == "__main__":
    run_main(main)
