"""Stage 11: speculative decoding. Guess k tokens cheaply, verify them in one forward pass of the
target, keep the ones it agrees with: exact for greedy, the target's distribution for sampling."""
import plumbing.runtime  # noqa: F401  (first: sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
from l4_sampler.params import SamplingParams

from .llm import LLM, build_engine

__all__ = ["LLM", "SamplingParams", "build_engine"]
