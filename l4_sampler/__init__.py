"""Stage 4: a vLLM-style sampler (per-request SamplingParams in one batch) and stop conditions.

``SamplingParams`` and ``StopChecker`` need no torch, so a script checks its sampling flags before
torch loads; the sampler itself (``l4_sampler.sampler``) is imported on first use."""
from .params import GREEDY_EPS, SamplingParams
from .stops import Finish, StopChecker

_SAMPLER = ("RowState", "Sampler", "SamplerOutput", "TokenLogprobs", "noise_seed", "apply_min_tokens",
            "apply_penalties", "apply_temperature", "apply_min_p", "apply_top_k_top_p")

__all__ = ["GREEDY_EPS", "SamplingParams", "Finish", "StopChecker", *_SAMPLER]


def __getattr__(name):
    if name in _SAMPLER:
        from . import sampler
        return getattr(sampler, name)
    raise AttributeError(f"module 'l4_sampler' has no attribute {name!r}")
