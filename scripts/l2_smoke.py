"""Stage 2 smoke test: paged KV (block allocator + token-flat pool), attention via a host gather.

    python scripts/l2_smoke.py                          # built-in tiny Qwen3 on CPU
    python scripts/l2_smoke.py --block-size 12 --num-blocks 8
"""

from plumbing.cli import base_parser, report, run_main
from harness.smoke import load
from paged_cli import add_paging_args, check_paging_args, paged_run


def main(argv=None):
    p = base_parser("l2_gather", __doc__)
    add_paging_args(p)
    args = p.parse_args(argv)
    check_paging_args(args)                  # before torch loads
    from l1_dense.generate import greedy_generate
    from l2_gather.engine import GatherEngine
    ld = load(args)
    _, gen, lines, extra = paged_run(
        ld, args, lambda nb, bs: GatherEngine(ld.model, nb, bs),
        lambda e: greedy_generate(e, ld.prompt_ids, args.max_new_tokens, ld.model.cfg.eos_token_ids))
    report("l2_gather", ld, gen.token_ids, args.json, extra={"finish_reason": gen.finish_reason, **extra},
           lines=[f"finish     : {gen.finish_reason}", *lines])


if __name__ == "__main__":
    run_main(main)
