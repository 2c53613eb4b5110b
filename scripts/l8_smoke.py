"""Stage 8 smoke test: stage 7's run on the sliding-window engine (KV cache groups, windowed kernels).

    python scripts/l8_smoke.py                                 # the built-in tiny Qwen3: no window, = stage 7
    python scripts/l8_smoke.py --model tiny-mistral            # every layer windowed (W = 20)
    python scripts/l8_smoke.py --model tiny-qwen2-hybrid       # windowed, full, windowed layers (W = 12)

The usual prompt's tokens must equal stage 7's on a checkpoint without windows, and transformers'
on a windowed one (stages 1-7 refuse those: ``python scripts/check_chain.py --model tiny-mistral``).
It adds a ``window`` line: the KV cache groups, the blocks the windows freed, and the most blocks
one request held in each group after a step, against the bound ceil(W / block_size) + 1 of a
windowed group. Every l7_smoke flag works here.
"""
import math

from l7_smoke import parser, run
from plumbing.cli import run_main


def observer(engine):
    """After every step: the most blocks one request held per group (a windowed group: at most
    ceil(W / block_size) + 1 between steps; a full group: its whole history)."""
    kv = engine.scheduler.kv
    if not hasattr(kv, "windows"):                   # no window: stage 7's KV manager, one full group
        return None, lambda: ["window     : 1 group(s): full (every layer); no block freed by a window"], \
            lambda: dict(kv_groups=[dict(window=None, layers=list(range(engine.model.cfg.num_layers)))],
                         blocks_freed=0, pool_blocks=kv.num_blocks)
    most = [0] * len(kv.windows)

    def after():
        for req in engine.scheduler.running:
            for g in range(len(most)):
                most[g] = max(most[g], kv.held(req.kv, g))

    def groups():
        return [dict(window=W, layers=list(g.layers), most_blocks_held=m,
                     bound=None if W is None else math.ceil(W / kv.block_size) + 1)
                for W, g, m in zip(kv.windows, engine.runner.cache.groups, most)]

    def lines():
        parts = [f"{'full' if d['window'] is None else 'W=' + str(d['window'])} {tuple(d['layers'])}: held <= "
                 f"{d['most_blocks_held']}" + (f" (bound {d['bound']})" if d['bound'] else "") for d in groups()]
        return [f"window     : {len(parts)} group(s): " + " | ".join(parts)
                + f"; {kv.blocks_freed} blocks freed by windows; pool {kv.num_blocks} blocks"]
    return after, lines, lambda: dict(kv_groups=groups(), blocks_freed=kv.blocks_freed, pool_blocks=kv.num_blocks)


def main(argv=None):
    args = parser("l8_sliding_window", __doc__).parse_args(argv)
    run(args, "l8_sliding_window", observer)


if __name__ == "__main__":
    run_main(main)
