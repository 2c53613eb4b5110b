"""Stage 4: a vLLM-style sampler (per-request SamplingParams in one batch) and stop conditions."""
import l1_dense  # noqa: F401  (sets up the Triton interpreter env when no GPU)

from .params import GREEDY_EPS, SamplingParams
from .sampler import (RowState, Sampler, SamplerOutput, TokenLogprobs, apply_min_p,
                      apply_min_tokens, apply_penalties, apply_temperature, apply_top_k_top_p,
                      noise_seed)
from .stops import Finish, StopChecker

__all__ = [
    "GREEDY_EPS", "SamplingParams",
    "RowState", "Sampler", "SamplerOutput", "TokenLogprobs", "noise_seed",
    "apply_min_tokens", "apply_penalties", "apply_temperature", "apply_min_p", "apply_top_k_top_p",
    "Finish", "StopChecker",
]
