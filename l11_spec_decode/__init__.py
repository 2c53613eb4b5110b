"""Stage 11: speculative decoding. Guess k tokens cheaply, verify them in one forward pass of the
target, keep the ones it agrees with: exact for greedy, the target's distribution for sampling.

    from l11_spec_decode import LLM, SamplingParams
    llm = LLM(None, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                        "prompt_lookup_max": 3})
    llm = LLM(None, speculative_config={"method": "draft_model", "model": "tiny-llama",
                                        "num_speculative_tokens": 3})
    llm.llm_engine.step_order.speculator.acceptance_rate()    # guesses kept / guesses verified
"""
from plumbing.lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, {
    'l4_sampler.params': ('SamplingParams',),
    '.stage': ('LLM', 'build_engine', 'STAGES'),
    '.speculator': ('Speculator',),
    '.step': ('Drafted', 'SpeculativeStep'),
})
