"""Stage 5 smoke test: the usual prompt served together with other requests by continuous batching.

    python scripts/l5_smoke.py                      # usual prompt + 4 others, small budget and pool
    python scripts/l5_smoke.py --trace              # one line per step: chunks, decodes, preemptions
    python scripts/l5_smoke.py --trace-meta         # ... and the metadata tensors of every step
    python scripts/l5_smoke.py --extra-requests 0   # the usual prompt alone
    python scripts/l5_smoke.py --temperature 0.8 --top-p 0.9 --seed 7   # = l4_smoke's seeded tokens

The defaults (harness/l5_demo.py: a 32-token budget, 14 blocks of 8 tokens) are small on purpose: the long prompt is
prefilled in chunks, and the pool runs out so that a request is preempted and recomputed. The
usual prompt's tokens must still equal stage 4's. Every l4_smoke flag works here and applies to
every request (the others keep their own max_tokens). The engine's flags are its options
(l5_scheduler/options.py; ``--help`` lists them), with the demo's defaults for the sizes.
"""
import sys
import time

from harness.l5_demo import BLOCK_SIZE, BUDGET, EXTRAS, NUM_BLOCKS, add_demo_requests, extra_prompts
from l4_smoke import add_sampling_args, note_ignored, sampling_params
from plumbing.cli import base_parser, report, run_main
from harness.smoke import load
from plumbing.errors import UserError

DEMO = dict(block_size=BLOCK_SIZE, num_gpu_blocks_override=NUM_BLOCKS, max_num_batched_tokens=BUDGET)
SKIP = ("seed",)             # the sampling flags' --seed sets every request's seed


def parser(stage: str, doc: str, defaults: dict = DEMO, extras: int = len(EXTRAS)):
    """A scheduler stage's smoke flags: the prompt and sampling flags, the engine's options as flags
    (``{stage}.options``: this stage's and every earlier one's), and the run's own."""
    from importlib import import_module
    p = base_parser(stage, doc, import_module(f"{stage}.options").ENGINE_OPTIONS, defaults, SKIP)
    add_sampling_args(p)
    g = p.add_argument_group("the smoke run")
    g.add_argument("--extra-requests", type=int, default=extras, choices=range(extras + 1),
                   help=f"how many other requests run with the usual prompt (0..{extras}, default {extras})")
    g.add_argument("--trace", action="store_true", help="print one line per step")
    g.add_argument("--trace-meta", action="store_true", help="with --trace: also print each step's metadata tensors")
    return p


def print_meta(meta):
    for name in ("positions", "slot_mapping", "cu_seqlens_q", "seq_lens_kv", "block_table", "logits_indices"):
        print(f"           {name:<14} = {getattr(meta, name).tolist()}")


def engine_options(args, stage: str, defaults: dict = DEMO):
    """The engine options the flags give (and the run's defaults), checked against their declarations:
    a bad value fails here, before the model loads."""
    from importlib import import_module
    from plumbing.options import given_flags, resolve
    if args.trace_meta and not args.trace:
        raise UserError("--trace-meta prints inside the trace: add --trace.")
    options = import_module(f"{stage}.options").ENGINE_OPTIONS
    return resolve({o.name: o for o in options}, given_flags(args, options, defaults, SKIP))


def make_engine(values, ld, stage: str, wrap=None):
    """The stage's engine (its assembler, ``{stage}.stage.build_engine``) for the checked options."""
    from importlib import import_module
    from l5_scheduler.llm import engine_config
    config = engine_config(values, ld.model, ld.device, next(ld.model.parameters()).dtype)
    return import_module(f"{stage}.stage").build_engine(ld.model, ld.tokenizer, config, args=values, wrap=wrap), config


def drive(engine, args, step=None, trace_more=None) -> float:
    """Step until every request is done (the trace, or a progress line every 10 s); returns seconds.
    ``step``: what runs one step (default ``engine.step``); ``trace_more()``: text for the trace line's end."""
    from l5_scheduler.request import RequestStatus
    step = step or engine.step
    t0 = last = time.perf_counter()
    while engine.has_unfinished_requests():
        step()
        if args.trace:
            print("trace      : " + engine.stats[-1].line() + (trace_more() if trace_more else ""))
            if args.trace_meta:
                print_meta(engine.last_meta)
        now = time.perf_counter()
        if not args.json and not args.trace and now - last >= 10:   # the interpreter is slow on a CPU
            last = now
            done = sum(r.status == RequestStatus.FINISHED for r in engine.requests.values())
            print(f"  ... step {len(engine.stats)}, {done}/{len(engine.requests)} requests done, {now - t0:.0f} s",
                  file=sys.stderr, flush=True)
    return time.perf_counter() - t0


def summarize(engine, config, ld, rid, ids, params, seconds):
    """The JSON keys and printed lines every scheduler stage reports; returns (comp, extra, lines).
    The pool is the engine's own (stage 8 cuts the same memory into more, smaller blocks)."""
    from l1_dense.dense_kv import default_max_seq_len
    from l5_scheduler.config import bytes_per_block
    cfg, config = ld.model.cfg, engine.config
    out = engine.output(rid)
    comp = out.outputs[0]
    others = {i: engine.output(i) for i in ids}             # decoded once each
    stats = engine.stats
    preemptions = sum(len(s.preempted) for s in stats)
    chunked = sorted({r for s in stats for r, st, n, plen in s.chunks if st + n < plen})   # a chunk ended early
    n_out = sum(len(r.output_ids) for r in engine.requests.values())
    bpb = engine.runner.cache.bytes_per_block
    full = bytes_per_block(cfg, config.block_size, next(ld.model.parameters()).dtype)   # every layer's
    peak = max(s.blocks_used for s in stats)
    stage1 = default_max_seq_len(cfg) * full // config.block_size * len(engine.requests)
    extra = {"finish_reason": comp.finish_reason, "stop_reason": comp.stop_reason, "seed": params.seed,
             "temperature": params.temperature, "kv_pool_bytes": config.num_blocks * bpb, "kv_used_bytes": peak * bpb,
             "kv_stage1_bytes": stage1, "elapsed_s": round(seconds, 3), "tokens_per_s": round(n_out / seconds, 3),
             "steps": len(stats), "preemptions": preemptions, "chunked_prefills": chunked,
             "requests": [{"request_id": i, "prompt_ids": o.prompt_token_ids, "token_ids": o.outputs[0].token_ids,
                           "finish_reason": o.outputs[0].finish_reason, "num_preemptions": o.num_preemptions}
                          for i, o in others.items()]}
    if comp.logprobs:
        extra["logprobs"] = [{"token_id": t, "logprob": d[t].logprob, "rank": d[t].rank,     # vLLM's shape, flattened
                              "top": sorted(((k, v.logprob) for k, v in d.items() if v.rank <= params.logprobs),
                                            key=lambda kv: -kv[1])}
                             for t, d in zip(comp.token_ids, comp.logprobs)]
    lines = [f"finish     : {comp.finish_reason} (preempted {out.num_preemptions}x)"]
    w = max([3] + [len(i) for i in others])
    for i, o in others.items():
        lines.append(f"request {i:<{w}}: prompt {len(o.prompt_token_ids):>3} tok -> {o.outputs[0].token_ids} "
                     f"({o.outputs[0].finish_reason}, preempted {o.num_preemptions}x)")
    lines += [f"time       : {seconds:.1f} s for {n_out} new tokens of {len(engine.requests)} requests, "
              f"{n_out / seconds:.1f} tokens/s (loading not included)",
              f"schedule   : {len(stats)} steps, budget {config.max_num_batched_tokens} tokens/step, "
              f"{preemptions} preemption(s), chunked prefills: {', '.join(chunked) or 'none'}",
              f"kv pool    : {config.num_blocks} blocks x {config.block_size} tokens = {config.num_blocks * bpb / 2**20:.3f} MiB, "
              f"peak {peak} blocks in use ({len(engine.requests)} requests; stage 1 would reserve {stage1 / 2**20:.2f} MiB)"]
    return comp, extra, lines


def main(argv=None):
    args = parser("l5_scheduler", __doc__).parse_args(argv)
    params = sampling_params(args)           # bad values fail here, before the model loads
    note_ignored(args)
    values = engine_options(args, "l5_scheduler")
    ld = load(args)
    engine, config = make_engine(values, ld, "l5_scheduler")
    extras = extra_prompts(ld.tokenizer, ld.model.cfg.vocab_size, args.extra_requests)
    rid, ids = add_demo_requests(engine, ld.prompt_ids, params, extras)
    seconds = drive(engine, args)
    comp, extra, lines = summarize(engine, config, ld, rid, ids, params, seconds)
    report("l5_scheduler", ld, comp.token_ids, args.json, extra=extra, lines=lines)


if __name__ == "__main__":
    run_main(main)
