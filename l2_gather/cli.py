"""Smoke-script pieces shared by the paged stages (2 and later): pool flags and the memory report."""
from l1_dense.errors import UserError


def add_paging_args(p):
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (any positive integer)")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="blocks in the pool (default: enough for the model's context, at most 4096 tokens)")


def pool_shape(args, cfg):
    if args.block_size < 1:
        raise UserError(f"--block-size must be a positive integer, got {args.block_size}.")
    num_blocks = args.num_blocks or -(-min(cfg.max_position_embeddings, 4096) // args.block_size)
    if num_blocks < 1:
        raise UserError(f"--num-blocks must be a positive integer, got {num_blocks}.")
    return num_blocks, args.block_size


def memory_lines(engine, n_tokens: int, cfg) -> tuple[list[str], dict]:
    alloc, pool = engine.alloc, engine.pool
    mib = 2**20
    stage1 = min(cfg.max_position_embeddings, 4096) * pool.bytes_per_block // alloc.block_size
    used = engine.used_bytes()
    lines = [f"kv pool    : {pool.nbytes / mib:.2f} MiB = {alloc.num_blocks} blocks x {alloc.block_size} tokens, shared by all requests",
             f"kv used    : {used / mib:.3f} MiB = {len(engine.req.blocks)} blocks for {n_tokens} tokens "
             f"({len(engine.req.blocks) * alloc.block_size - n_tokens} slots of internal fragmentation)",
             f"stage 1    : {stage1 / mib:.2f} MiB reserved for this one request (max_seq_len rows, used or not)"]
    return lines, {"kv_pool_bytes": pool.nbytes, "kv_used_bytes": used, "kv_stage1_bytes": stage1}
