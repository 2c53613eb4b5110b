"""Stage 13 smoke test: stage 9's run with batch-invariant kernels (vLLM's ``VLLM_BATCH_INVARIANT``).

    python scripts/l13_smoke.py                                   # tiny Qwen3, float32, the interpreter
    python scripts/l13_smoke.py --device cuda --dtype bfloat16    # a GPU: the mode's point

Greedy tokens must equal stage 9's (and transformers') in float32: the invariant kernels sum in
another order than cuBLAS and stage 7's splits, never enough to change a float32 argmax here. Adds
a ``batch inv.`` line: which parts ran (every matmul through one kernel, attention cut at fixed key
positions). Every l9_smoke flag works here, and ``--no-batch-invariant`` runs stage 12's parts for
comparison.
"""
from l7_smoke import parser, run
from l9_smoke import observer as kv_observer
from plumbing.cli import run_main


def observer(engine):
    after, kv_lines, kv_extra = kv_observer(engine)
    ops, cache = type(engine.runner.ops).__name__, type(engine.runner.cache).__name__

    def lines():
        return kv_lines() + [f"batch inv.: ops {ops}, KV cache {cache}"]
    return after, lines, lambda: dict(kv_extra(), ops=ops, kv_cache=cache)


def main(argv=None):
    p = parser("l13_batch_invariant", __doc__)
    p.set_defaults(batch_invariant=True)
    args = p.parse_args(argv)
    run(args, "l13_batch_invariant", observer)


if __name__ == "__main__":
    run_main(main)
