"""Stage 3 smoke test: block-tensor KV, three metadata tensors, paged attention in one call.

    python scripts/l3_smoke.py                      # Triton kernel (the interpreter on CPU)
    python scripts/l3_smoke.py --impl torch         # the PyTorch reference (Path A)
    python scripts/l3_smoke.py --check              # validate the metadata before every launch
"""

from plumbing.cli import base_parser, report, run_main
from harness.smoke import load
from paged_cli import add_paging_args, check_paging_args, paged_run


def main(argv=None):
    p = base_parser("l3_paged", __doc__)
    add_paging_args(p)
    p.add_argument("--impl", choices=["torch", "triton"], default="triton",
                   help="attention path: PyTorch reference or the Triton kernel (default)")
    p.add_argument("--check", action="store_true", help="validate metadata before each launch (syncs the host)")
    args = p.parse_args(argv)
    check_paging_args(args)                  # before torch loads
    from l1_dense.generate import greedy_generate
    from l3_paged.engine import PagedEngine
    ld = load(args)
    _, gen, lines, extra = paged_run(
        ld, args, lambda nb, bs: PagedEngine(ld.model, nb, bs, impl=args.impl, check=args.check),
        lambda e: greedy_generate(e, ld.prompt_ids, args.max_new_tokens, ld.model.cfg.eos_token_ids))
    report(f"l3_paged[{args.impl}]", ld, gen.token_ids, args.json,
           extra={"impl": args.impl, "finish_reason": gen.finish_reason, **extra},
           lines=[f"finish     : {gen.finish_reason}", *lines])


if __name__ == "__main__":
    run_main(main)
