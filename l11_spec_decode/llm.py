"""``LLM`` with speculative decoding: stage 9's engine (and so stages 5-8's parts), given one more
part, the speculator.

    from l11_spec_decode import LLM, SamplingParams
    llm = LLM(None, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                        "prompt_lookup_max": 3})
    llm = LLM(None, speculative_config={"method": "draft_model", "model": "tiny-llama",
                                        "num_speculative_tokens": 3})
    llm = LLM(None)                                   # no speculative_config: stage 9 exactly
    llm.llm_engine.speculator.acceptance_rate()       # guesses kept / guesses verified

    drafter     NgramDrafter, DraftModelDrafter or ReplayDrafter (drafters.py, draft_model.py)
    speculator  Speculator (speculator.py): proposes after each step, verifies in the next
    the rest    stage 9's: the KV manager, the runner, the sampler, the one engine loop

What the earlier stages do for it (their lessons say so): the scheduler schedules a request's
guesses beside its last token and ``advance`` keeps only the accepted ones' K/V (stage 5), and the
runner returns logits at every guess (stage 7).
"""
from __future__ import annotations

from l5_scheduler import llm as stage5
from l9_fp8_kv import llm as stage9

from .config import parse_spec_config
from .draft_model import DraftModelDrafter
from .drafters import NgramDrafter, ReplayDrafter
from .speculator import Speculator


def make_drafter(spec, model, config, impl: str):
    if spec.method == "ngram":
        return NgramDrafter(spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "draft_model":
        return DraftModelDrafter(spec.model, model, config, impl=impl)
    return ReplayDrafter(spec.reference, spec.acceptance_rate, model.cfg.vocab_size)


def build_engine(model, tokenizer, config, *, speculative_config: dict | None = None, seed: int | None = None,
                 impl: str = "triton", kv_cache_dtype: str = "auto", enable_prefix_caching: bool = True,
                 check: bool = False, fused_ops: bool = True, split_kv: bool = True, gemv: bool = True,
                 norm_prologue: bool = True, pdl: bool = True, enforce_eager: bool = False, profiler=None, **kw):
    """No ``speculative_config``: stage 9's builder, unchanged. Otherwise stage 9's parts plus a
    speculator. (Stage 9's options are named so that ``LLM()`` can check a caller's.)"""
    kw |= dict(kv_cache_dtype=kv_cache_dtype, enable_prefix_caching=enable_prefix_caching, check=check,
               fused_ops=fused_ops, split_kv=split_kv, gemv=gemv, norm_prologue=norm_prologue, pdl=pdl,
               enforce_eager=enforce_eager, profiler=profiler)
    spec = parse_spec_config(speculative_config)
    if spec is None:
        return stage9.build_engine(model, tokenizer, config, seed=seed, impl=impl, **kw)
    kw.setdefault("async_scheduling", False)      # a draft needs the token before it (the engine says so if asked)
    speculator = Speculator(make_drafter(spec, model, config, impl), spec.num_speculative_tokens,
                            config.max_model_len, spec.disable_by_batch_size, seed=seed)
    return stage9.build_engine(model, tokenizer, config, seed=seed, impl=impl, speculator=speculator,
                               verify_graphs=(spec.num_speculative_tokens + 1, spec.disable_by_batch_size), **kw)


def LLM(model: str | None = None, **kw) -> stage5.LLM:
    """``l5_scheduler.LLM`` built by this stage's ``build_engine``; every stage 5-9 argument works."""
    return stage5.LLM(model, build_engine=build_engine, **kw)
