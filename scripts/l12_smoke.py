"""Stage 12 smoke test: stage 9's run with the model split over ranks (vLLM's ``--tensor-parallel-size``).

    python scripts/l12_smoke.py --tensor-parallel-size 2            # 2 processes joined by gloo on a CPU
    python scripts/l12_smoke.py --tensor-parallel-size 4            # tiny Qwen3's 2 KV heads, each on 2 ranks
    python scripts/l12_smoke.py --tensor-parallel-size 2 --model tiny-qwen2-hybrid   # windows kept

Greedy tokens must equal stage 9's (and transformers'): the split changes where each product is
computed and adds its partial sums, never which token wins (in float32; bfloat16 may round apart).
Adds a ``tensor par.`` line: the ranks, the collectives' backend, and what sending each step's
inputs to the workers cost this process. Every l9_smoke flag works here.
"""
from l7_smoke import parser, run
from l9_smoke import observer as kv_observer
from plumbing.cli import run_main


def observer(engine):
    after, kv_lines, kv_extra = kv_observer(engine)
    group = getattr(engine.model, "tensor_parallel", None)

    def extra():
        more = dict(tensor_parallel_size=group.tp if group else 1)
        if group:
            more.update(backend=group.spec.backend, steps_sent=group.sent.steps, send_cpu_s=group.sent.cpu_s,
                        send_bytes=group.sent.bytes)
        return dict(kv_extra(), **more)

    def lines():
        if group is None:
            return kv_lines() + ["tensor par.: 1 rank: stage 11's engine, part for part"]
        line = (f"tensor par.: {group.tp} ranks ({group.spec.backend}), {engine.model.cfg.num_heads} query and "
                f"{engine.model.cfg.num_kv_heads} KV heads each; {group.sent}")
        group.close()
        return kv_lines() + [line]
    return after, lines, extra


def main(argv=None):
    args = parser("l12_tensor_parallel", __doc__).parse_args(argv)
    run(args, "l12_tensor_parallel", observer)


if __name__ == "__main__":
    run_main(main)
