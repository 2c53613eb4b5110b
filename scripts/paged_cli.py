"""Smoke-script pieces shared by the single-sequence paged stages (2-4): pool flags, the run, the
memory report. The stage modules load inside the functions, after the flags are checked."""
from plumbing.cli import Watch, positive_or_none
from plumbing.errors import UserError


def add_paging_args(p):
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (any positive integer)")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="blocks in the pool (default: enough for the model's context, at most 4096 tokens)")


def check_paging_args(args) -> None:
    """Before anything loads: the pool flags must be positive."""
    if args.block_size < 1:
        raise UserError(f"--block-size must be a positive integer, got {args.block_size}.")
    positive_or_none("--num-blocks", args.num_blocks)


def pool_shape(args, cfg):
    from l1_dense.dense_kv import default_max_seq_len
    check_paging_args(args)
    num_blocks = args.num_blocks
    if num_blocks is None:
        num_blocks = -(-default_max_seq_len(cfg) // args.block_size)           # stage 1's capacity
    return num_blocks, args.block_size


def memory_lines(engine, n_tokens: int, cfg) -> tuple[list[str], dict]:
    from l1_dense.dense_kv import default_max_seq_len
    alloc, pool = engine.alloc, engine.pool
    mib = 2**20
    stage1 = default_max_seq_len(cfg) * pool.bytes_per_block // alloc.block_size  # what l1_smoke reserves
    used = engine.used_bytes()
    lines = [f"kv pool    : {pool.nbytes / mib:.2f} MiB = {alloc.num_blocks} blocks x {alloc.block_size} tokens, shared by all requests",
             f"kv used    : {used / mib:.3f} MiB = {len(engine.req.blocks)} blocks for {n_tokens} tokens "
             f"({len(engine.req.blocks) * alloc.block_size - n_tokens} slots of internal fragmentation)",
             f"stage 1    : {stage1 / mib:.2f} MiB reserved for this one request (max_seq_len rows, used or not)"]
    return lines, {"kv_pool_bytes": pool.nbytes, "kv_used_bytes": used, "kv_stage1_bytes": stage1}


def paged_run(ld, args, make_engine, run):
    """Size the pool from the flags, check the request, build the engine, run it (timed, with
    progress on stderr), report time and memory.

    ``make_engine(num_blocks, block_size)`` builds the stage's engine, ``run(engine)`` generates.
    A pool that runs dry becomes a UserError that names the flag to raise.
    """
    from l1_dense.generate import check_prompt
    from l2_gather.allocator import OutOfBlocks
    cfg = ld.model.cfg
    num_blocks, block_size = pool_shape(args, cfg)
    check_prompt(ld.prompt_ids, args.max_new_tokens, cfg, num_blocks * block_size, "--num-blocks")
    engine = make_engine(num_blocks, block_size)
    watch = Watch(engine, args.max_new_tokens, quiet=args.json)
    try:
        gen = run(watch)
    except OutOfBlocks as e:
        raise UserError(f"the KV pool ran out of blocks ({e}): raise --num-blocks.") from None
    time_line, extra = watch.timing(len(gen.token_ids))
    lines, mem = memory_lines(engine, engine.req.cur_len, cfg)  # the last new token is never fed back
    return engine, gen, [time_line, *lines], {**extra, **mem}
