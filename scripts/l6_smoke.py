"""Stage 6 smoke test: the usual prompt served with requests that share it, with prefix caching.

    python scripts/l6_smoke.py                              # usual prompt + 4 sharing requests
    python scripts/l6_smoke.py --trace                      # one line per step: hits, chunks, preemptions
    python scripts/l6_smoke.py --no-enable-prefix-caching   # the same run without the cache (stage 5's tokens)
    python scripts/l6_smoke.py --extra-requests 0           # the usual prompt alone

The default workload (harness/l6_demo.py) puts a request that *contains* the usual prompt
first, so the usual prompt finds its blocks cached and computes only its last block. Its tokens
must still equal stage 5's. The run ends with the hit rate and the prefill tokens the cache
saved. Every l5_smoke flag works here.
"""
from harness import l6_demo as demo
from harness.smoke import load
from l4_smoke import note_ignored, sampling_params
from l5_smoke import DEMO, drive, engine_options, make_engine, parser, summarize
from plumbing.cli import report, run_main

DEMO6 = dict(DEMO, num_gpu_blocks_override=demo.NUM_BLOCKS)    # stage 6's demo pool: two blocks more


def cache_trace(engine, enabled: bool):
    """The trace line's end with the prefix cache on: how many blocks have a hash (held or free)."""
    return (lambda: f" | cached {len(engine.scheduler.kv.pool.cached)}") if enabled else None


def main(argv=None):
    args = parser("l6_prefix_cache", __doc__, DEMO6, len(demo.MAX_TOKENS)).parse_args(argv)
    params = sampling_params(args)
    note_ignored(args)
    values = engine_options(args, "l6_prefix_cache", DEMO6)
    args.enable_prefix_caching = values.enable_prefix_caching
    ld = load(args)
    engine, config = make_engine(values, ld, "l6_prefix_cache")
    rid, ids = demo.add_demo_requests(engine, ld.prompt_ids, params, ld.tokenizer, args.extra_requests)
    seconds = drive(engine, args, trace_more=cache_trace(engine, args.enable_prefix_caching))
    comp, extra, lines = summarize(engine, config, ld, rid, ids, params, seconds)
    prompt_tokens = sum(len(r.prompt_ids) for r in engine.requests.values())
    computed = sum(s.prefill_tokens for s in engine.stats)
    extra.update(enable_prefix_caching=args.enable_prefix_caching, prompt_tokens=prompt_tokens,
                 prefill_tokens_computed=computed)
    if args.enable_prefix_caching:
        st = engine.scheduler.kv.stats
        usual_hit = next((n for s in engine.stats for r, n in s.hits if r == rid), 0)   # its first admission
        extra.update(cache_queries=st.queries, cache_hits=st.hits, hit_rate=round(st.hit_rate, 4),
                     readmit_queries=st.readmit_queries, readmit_hits=st.readmit_hits, usual_hit_tokens=usual_hit)
        lines += [f"usual hit  : {usual_hit} of its {len(ld.prompt_ids)} prompt tokens found cached",
                  f"prefix hit : {st.hits} of {st.queries} prompt tokens found cached ({100 * st.hit_rate:.1f}%); "
                  f"readmissions after preemption: {st.readmit_hits} of {st.readmit_queries}"]
    lines.append(f"prefill    : {computed} tokens computed for {prompt_tokens} prompt tokens "
                 f"(+ recomputation after preemption){'' if args.enable_prefix_caching else ', prefix caching off'}")
    report("l6_prefix_cache", ld, comp.token_ids, args.json, extra=extra, lines=lines)


if __name__ == "__main__":
    run_main(main)
