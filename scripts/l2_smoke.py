"""Stage 2 smoke test: paged KV (block allocator + token-flat pool), attention via a host gather.

    python scripts/l2_smoke.py                          # built-in tiny Qwen3 on CPU
    python scripts/l2_smoke.py --block-size 12 --num-blocks 8
"""
import _path  # noqa: F401

from l1_dense.cli import base_parser, load, report, run_main
from l1_dense.errors import UserError
from l2_gather.cli import add_paging_args, memory_lines, pool_shape
from l1_dense.generate import check_prompt, greedy_generate
from l2_gather.allocator import OutOfBlocks
from l2_gather.engine import GatherEngine


def main(argv=None):
    p = base_parser("l2_gather", __doc__)
    add_paging_args(p)
    args = p.parse_args(argv)
    ld = load(args)
    cfg = ld.model.cfg
    num_blocks, block_size = pool_shape(args, cfg)
    check_prompt(ld.prompt_ids, args.max_new_tokens, cfg, num_blocks * block_size)
    engine = GatherEngine(ld.model, num_blocks, block_size)
    try:
        gen = greedy_generate(engine, ld.prompt_ids, args.max_new_tokens, cfg.eos_token_ids)
    except OutOfBlocks as e:
        raise UserError(f"the KV pool ran out of blocks ({e}): raise --num-blocks.") from None
    lines, extra = memory_lines(engine, engine.req.cur_len, cfg)  # the last new token is never fed back
    report("l2_gather", ld, gen.token_ids, args.json, extra={"finish_reason": gen.finish_reason, **extra},
           lines=[f"finish     : {gen.finish_reason}", *lines])


if __name__ == "__main__":
    run_main(main)
