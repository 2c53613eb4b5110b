"""Stage 7 smoke test: stage 6's run with the fast runner (CUDA graphs, fused kernels, split-KV).

    python scripts/l7_smoke.py                       # the usual prompt + stage 6's sharing requests
    python scripts/l7_smoke.py --profile             # per-step breakdown: host, GPU wait, launches
    python scripts/l7_smoke.py --enforce-eager       # no CUDA graphs (vLLM's flag)
    python scripts/l7_smoke.py --no-fused-ops --no-split-kv   # stage 3's kernel and the torch ops
    python scripts/l7_smoke.py --no-async-scheduling # each step waits for its tokens before the next

The usual prompt's tokens must equal stage 6's (and so lesson 1's). On a CPU there is no CUDA
graph (every step runs eagerly, through the Triton interpreter, and says so), and --profile
reports host time only: kernel counts need the CUDA profiler. Every l6_smoke flag works here.
"""
import sys

from harness import l6_demo as demo
from harness.smoke import load
from l4_smoke import note_ignored, sampling_params
from l5_smoke import drive, engine_options, make_engine, summarize
from l5_smoke import parser as engine_parser
from l6_smoke import DEMO6, cache_trace
from plumbing.cli import report, run_main


def profile_lines(args, ld, params, profiler, values, stage: str) -> tuple[list[str], dict]:
    """Timing table from the run itself; on CUDA, kernels and launches from a second, profiled run."""
    from l7_fast.profile import kernel_profile, summarize_timings
    modes = summarize_timings(profiler.timings)
    kernels = {}
    if ld.device.startswith("cuda"):
        again, _ = make_engine(values, ld, stage)
        demo.add_demo_requests(again, ld.prompt_ids, params, ld.tokenizer, args.extra_requests)
        while again.has_unfinished_requests():
            k = kernel_profile(again.step)
            m = kernels.setdefault(again.runner.mode_log[-1], dict(steps=0, kernels=0, launch_calls=0, gpu_busy_ms=0.0))
            m["steps"] += 1
            for key in ("kernels", "launch_calls", "gpu_busy_ms"):
                m[key] += k[key]
    lines = ["profile    : mode      steps  tokens/step  wall ms  host ms  GPU-wait ms  kernels/step  "
             "launch calls/step  GPU busy ms  busy %"]
    for mode, m in sorted(modes.items()):
        k = kernels.get(mode)
        per = (lambda key: k[key] / k["steps"]) if k else None
        tail = (f"{per('kernels'):>12.0f}  {per('launch_calls'):>17.0f}  {per('gpu_busy_ms'):>11.3f}  "
                f"{100 * per('gpu_busy_ms') / m['wall_ms']:>5.0f}%") if k else "  (kernel counts need CUDA)"
        lines.append(f"             {mode:<9} {m['steps']:>5}  {m['tokens'] / m['steps']:>11.1f}  {m['wall_ms']:>7.2f}  "
                     f"{m['host_ms']:>7.2f}  {m['wait_ms']:>11.2f}  {tail}")
    return lines, dict(modes=modes, kernels=kernels)


def parser(stage: str, doc: str, defaults: dict = DEMO6):
    """l7_smoke's flags: every l6_smoke flag (the engine's options up to ``stage``), and --profile."""
    p = engine_parser(stage, doc, defaults, len(demo.MAX_TOKENS))
    p.add_argument("--profile", action="store_true", help="per-step breakdown: host time, GPU wait, kernels, launches")
    return p


def main(argv=None):
    args = parser("l7_fast", __doc__).parse_args(argv)
    run(args, "l7_fast")


def run(args, stage: str, observer=None, defaults: dict = DEMO6) -> None:
    """Build, drive and report. ``observer(engine)`` (l8_smoke) returns (after_step, lines, extra)."""
    params = sampling_params(args)
    note_ignored(args)
    values = engine_options(args, stage, defaults)
    for name in ("enable_prefix_caching", "enforce_eager", "fused_ops", "split_kv"):
        setattr(args, name, getattr(values, name))   # the run's settings, as the report shows them
    ld = load(args)
    if values.enforce_eager and not ld.device.startswith("cuda"):
        print("note       : --enforce-eager changes nothing on a CPU: there are no CUDA graphs, every step is eager",
              file=sys.stderr)
    from l7_fast import Profiler
    profiler = Profiler() if args.profile else None
    engine, config = make_engine(values, ld, stage, wrap=profiler.wrap if profiler else None)
    rid, ids = demo.add_demo_requests(engine, ld.prompt_ids, params, ld.tokenizer, args.extra_requests)
    after, more_lines, more_extra = observer(engine) if observer else (None, None, None)

    def step():
        profiler.step(engine) if profiler else engine.step()
        if after:
            after()
    seconds = drive(engine, args, step=step, trace_more=cache_trace(engine, args.enable_prefix_caching))
    comp, extra, lines = summarize(engine, config, ld, rid, ids, params, seconds)
    lines.append(fast_path_line(engine.runner, args, ld, extra))
    if more_lines:
        lines += more_lines()
        extra.update(more_extra())
    if args.profile:
        more, prof = profile_lines(args, ld, params, profiler, values, stage)
        lines += more
        extra["profile"] = prof
    report(stage, ld, comp.token_ids, args.json, extra=extra, lines=lines)


def fast_path_line(r, args, ld, extra: dict) -> str:
    """How many steps replayed a CUDA graph, and which parts were on (also into ``extra``)."""
    graphs = list(getattr(r, "keys", None) or getattr(r, "graphs", {}))   # a GraphRunner's (or stage 12's,
                                                     # across ranks: keys); the eager FastRunner has none
    n_graph = sum(1 for m in r.mode_log if m.startswith("graph"))
    extra.update(enforce_eager=args.enforce_eager, fused_ops=args.fused_ops, split_kv=args.split_kv,
                 graph_steps=n_graph, eager_steps=len(r.mode_log) - n_graph, graph_buckets=sorted(graphs, key=str),
                 graph_bytes=getattr(r, "graph_bytes", 0), capture_s=round(getattr(r, "capture_s", 0.0), 3))
    return (f"fast path  : {n_graph} of {len(r.mode_log)} steps replayed a CUDA graph "
            + (f"({len(graphs)} buckets {sorted(graphs, key=str)}, captured in {r.capture_s:.1f} s, "
               f"{r.graph_bytes / 2**20:.1f} MiB of graph memory)" if graphs else
               "(enforce_eager)" if args.enforce_eager else "(no CUDA: every step eager)"
               if not ld.device.startswith("cuda") or args.enforce_eager else "(--impl torch: not capturable)")
            + f"; fused ops {'on' if args.fused_ops else 'off'}, split-KV {'on' if r.split_kv else 'off'}")


if __name__ == "__main__":
    run_main(main)
