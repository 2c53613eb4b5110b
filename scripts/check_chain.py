"""The chain check: Hugging Face transformers' greedy generate() against every stage built so far.

    python scripts/check_chain.py                                   # tiny Qwen3, float32, CPU
    python scripts/check_chain.py --model Qwen/Qwen3-0.6B --device cuda --dtype bfloat16

For each stage: are its token ids identical to the oracle's, where do they first differ, and how
far apart are the next-token logits (max |diff| over the steps before any divergence). Exits 1
on any token mismatch. In bfloat16 two correct paths can pick different tokens where the
oracle's top-1 margin is within rounding; the table shows that margin at the first difference.
"""
from __future__ import annotations

import sys

import _path  # noqa: F401
import torch

from l1_dense.checkpoint import resolve_model_dir
from l1_dense.cli import base_parser, load, run_main
from l1_dense.dense_kv import DenseEngine
from l1_dense.generate import Generation, check_prompt, greedy_generate
from l2_gather.engine import GatherEngine
from l3_paged.engine import PagedEngine
from l4_sampler.generate import sample_generate
from l4_sampler.params import SamplingParams

BLOCK_SIZE = 16


def stage_engines(model, n_tokens: int):
    """name -> engine factory, in lesson order. Later stages register here as they are built."""
    nb = -(-n_tokens // BLOCK_SIZE) + 1
    return {
        "l1_dense": lambda: DenseEngine(model, n_tokens),
        "l2_gather": lambda: GatherEngine(model, nb, BLOCK_SIZE),
        "l3_paged[torch]": lambda: PagedEngine(model, nb, BLOCK_SIZE, impl="torch", check=True),
        "l3_paged[triton]": lambda: PagedEngine(model, nb, BLOCK_SIZE, impl="triton", check=True),
    }


def run_stages(model, prompt_ids, max_new_tokens, only=None) -> dict[str, Generation]:
    n = len(prompt_ids) + max_new_tokens
    eos = model.cfg.eos_token_ids
    engines = stage_engines(model, n)
    runs = {name: (lambda make=make: greedy_generate(make(), prompt_ids, max_new_tokens, eos, keep_logits=True))
            for name, make in engines.items()}
    # Stage 4 samples on stage 3's engine; at temperature 0 it must be the same argmax.
    runs["l4_sampler[t=0]"] = lambda: sample_generate(
        engines["l3_paged[triton]"](), prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_new_tokens),
        eos, model.cfg.max_position_embeddings, keep_logits=True)
    return {name: run() for name, run in runs.items() if not only or name in only}


def hf_generate(path, prompt_ids, max_new_tokens, device, dtype) -> Generation:
    """The oracle: transformers' own model class and generate(), on the same checkpoint files."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    out = hf.generate(torch.tensor([prompt_ids], device=device), max_new_tokens=max_new_tokens,
                      do_sample=False, top_k=None, top_p=None, temperature=None,
                      output_logits=True, return_dict_in_generate=True)
    ids = out.sequences[0, len(prompt_ids):].tolist()
    logits = [step[0].float().cpu() for step in out.logits]
    reason = "length" if len(ids) == max_new_tokens else "eos"
    return Generation(ids, reason, logits)


def compare(ref: Generation, gen: Generation) -> dict:
    first = next((i for i, (a, b) in enumerate(zip(ref.token_ids, gen.token_ids)) if a != b), None)
    if first is None and len(ref.token_ids) != len(gen.token_ids):
        first = min(len(ref.token_ids), len(gen.token_ids))
    upto = len(ref.token_ids) if first is None else first
    diff = max((float((a - b).abs().max()) for a, b in zip(ref.logits[:upto], gen.logits[:upto])), default=0.0)
    margin = None
    if first is not None and first < len(ref.logits):
        top2 = ref.logits[first].topk(2).values
        margin = float(top2[0] - top2[1])
    return {"identical": first is None, "first_diff": first, "max_logit_diff": diff, "margin_at_diff": margin}


def main(argv=None) -> int:
    p = base_parser("check_chain", __doc__)
    p.add_argument("--stages", default=None, help="comma-separated subset of stages to run")
    args = p.parse_args(argv)
    ld = load(args)
    check_prompt(ld.prompt_ids, args.max_new_tokens, ld.model.cfg)
    ref = hf_generate(resolve_model_dir(args.model), ld.prompt_ids, args.max_new_tokens,
                      ld.device, next(ld.model.parameters()).dtype)
    only = args.stages.split(",") if args.stages else None
    results = {name: (gen, compare(ref, gen)) for name, gen in
               run_stages(ld.model, ld.prompt_ids, args.max_new_tokens, only).items()}

    margins = [float(t.topk(2).values[0] - t.topk(2).values[1]) for t in ref.logits]
    print(f"model={ld.label} device={ld.device} dtype={ld.dtype_name} prompt_len={len(ld.prompt_ids)} "
          f"new_tokens={len(ref.token_ids)} (oracle finish: {ref.finish_reason})")
    print(f"oracle (HF generate) : {ref.token_ids}")
    print(f"oracle top-1 margin  : min {min(margins):.4g} over the {len(margins)} steps")
    print()
    print(f"| {'stage':<18} | tokens identical | first diff | max abs logit diff | margin at diff |")
    print(f"|{'-' * 20}|------------------|------------|--------------------|----------------|")
    for name, (gen, c) in results.items():
        first = "-" if c["first_diff"] is None else str(c["first_diff"])
        margin = "-" if c["margin_at_diff"] is None else f"{c['margin_at_diff']:.3g}"
        print(f"| {name:<18} | {'yes' if c['identical'] else 'NO':<16} | {first:>10} | "
              f"{c['max_logit_diff']:>18.3e} | {margin:>14} |")
    bad = [n for n, (_, c) in results.items() if not c["identical"]]
    print()
    if bad:
        print(f"chain: MISMATCH in {', '.join(bad)}")
        return 1
    print(f"chain: OK, {len(results)} stage(s) emit the oracle's {len(ref.token_ids)} tokens exactly")
    return 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
