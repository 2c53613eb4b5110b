"""Stage 4 smoke test: stage 3's paged engine + a vLLM-style sampler and stop conditions.

    python scripts/l4_smoke.py                                    # temperature 0: greedy, = stage 3
    python scripts/l4_smoke.py --temperature 0.8 --top-p 0.9 --seed 7 --logprobs 3
    python scripts/l4_smoke.py --temperature 1 --top-k 20 --min-p 0.05 --repetition-penalty 1.2 --seed 1

Unlike vLLM (temperature 1.0), this script defaults to temperature 0 so that its tokens can be
checked against stages 1-3 and the oracle. --max-new-tokens is SamplingParams.max_tokens.
"""

from plumbing.cli import base_parser, note, report, run_main
from harness.smoke import load
from plumbing.errors import UserError
from paged_cli import add_paging_args, check_paging_args, paged_run
from l4_sampler.params import GREEDY_EPS, SamplingParams


def add_sampling_args(p):
    g = p.add_argument_group("sampling (vLLM SamplingParams names)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--min-tokens", type=int, default=0)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--stop-token-ids", default="", help="comma-separated token ids")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--logprobs", type=int, default=None, help="top logprobs to return per token")


def sampling_params(args) -> SamplingParams:
    try:
        stop_ids = [int(t) for t in args.stop_token_ids.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--stop-token-ids must be comma-separated integers, got {args.stop_token_ids!r}.") from None
    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, seed=args.seed, max_tokens=args.max_new_tokens,
        min_tokens=args.min_tokens, stop_token_ids=stop_ids, stop=args.stop, ignore_eos=args.ignore_eos,
        logprobs=args.logprobs)


def note_ignored(args) -> None:
    """At temperature 0 the token is the argmax: no noise, no truncation. Say which flags that ignores."""
    if args.temperature >= GREEDY_EPS:
        return
    given = [f"--{k.replace('_', '-')} {v}" for k, v, off in (
        ("seed", args.seed, None), ("top_k", args.top_k, 0), ("top_p", args.top_p, 1.0), ("min_p", args.min_p, 0.0))
        if v != off]
    if given:
        note(f"{', '.join(given)} ignored at --temperature 0 (greedy: the argmax, no randomness); "
             "pass --temperature > 0 to sample.")


def main(argv=None):
    p = base_parser("l4_sampler", __doc__)
    add_paging_args(p)
    add_sampling_args(p)
    p.add_argument("--impl", choices=["torch", "triton"], default="triton")
    args = p.parse_args(argv)
    params = sampling_params(args)           # bad values fail here, before torch loads
    check_paging_args(args)
    note_ignored(args)
    from l3_paged.engine import PagedEngine
    from l4_sampler.generate import sample_generate
    from l4_sampler.sampler import Sampler
    ld = load(args)
    cfg = ld.model.cfg
    if params.stop and ld.tokenizer is None:
        raise UserError("--stop needs a tokenizer to decode text, and this checkpoint has none: use --stop-token-ids.")
    decode = ld.tokenizer.decode if ld.tokenizer is not None else None

    def run(engine):
        capacity = engine.alloc.num_blocks * engine.alloc.block_size
        return sample_generate(engine, ld.prompt_ids, params, cfg.eos_token_ids,
                               min(cfg.max_position_embeddings, capacity), decode, Sampler())
    _, gen, lines, extra = paged_run(
        ld, args, lambda nb, bs: PagedEngine(ld.model, nb, bs, impl=args.impl), run)
    extra.update(finish_reason=gen.finish_reason, stop_reason=gen.stop_reason, seed=params.seed,
                 temperature=params.temperature)
    if gen.logprobs:
        extra["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob, "top": lp.top} for lp in gen.logprobs]
    out_lines = [f"finish     : {gen.finish_reason} ({gen.label})"]
    if gen.text is not None and params.stop:
        out_lines.append(f"text (cut) : {gen.text!r}")
    for i, lp in enumerate(gen.logprobs[:5]):
        top = ", ".join(f"{t}:{v:.3f}" for t, v in lp.top)
        out_lines.append(f"logprobs[{i}]: sampled {lp.token_id} ({lp.logprob:.3f}); top {top}")
    report("l4_sampler", ld, gen.token_ids, args.json, extra=extra, lines=out_lines + lines)


if __name__ == "__main__":
    run_main(main)
