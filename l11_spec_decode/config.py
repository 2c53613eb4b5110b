"""``speculative_config``: vLLM's dict, checked before anything is built.

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    {"method": "draft_model", "model": "PATH", "num_speculative_tokens": 4}
    {"method": "replay", "num_speculative_tokens": 4, "reference": {prompt ids tuple: continuation},
     "acceptance_rate": 0.8}                          (this project's, for benchmarks and tests)

``disable_by_batch_size`` (vLLM's name): no guesses in a step with more decoding requests than
this (the speculator's pay-off rule); default 8, from ``benchmarks/bench_spec.py``. Unknown keys and
methods this engine does not implement (eagle, medusa, mtp, suffix, ...) are refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from plumbing.errors import UserError

METHODS = ("ngram", "draft_model", "replay")
KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model",
        "disable_by_batch_size", "reference", "acceptance_rate"}
MAX_K = 16


@dataclass
class SpecConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None
    disable_by_batch_size: int = 8
    reference: dict = field(default_factory=dict)
    acceptance_rate: float = 1.0


def _int(d: dict, key: str, lo: int, hi: int, default=None) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise UserError(f"speculative_config[{key!r}] must be an int in [{lo}, {hi}], got {v!r}.")
    return v


def parse_spec_config(d) -> SpecConfig | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise UserError(f"speculative_config must be a dict like {{'method': 'ngram', 'num_speculative_tokens': 4}}, "
                        f"got {type(d).__name__}.")
    unknown = sorted(set(d) - KEYS)
    if unknown:
        raise UserError(f"speculative_config keys {unknown} are not supported here; known: {sorted(KEYS)}.")
    method = d.get("method")
    if method not in METHODS:
        raise UserError(f"speculative_config['method'] = {method!r} is not implemented: use one of {list(METHODS)}.")
    cfg = SpecConfig(method, _int(d, "num_speculative_tokens", 1, MAX_K),
                     disable_by_batch_size=_int(d, "disable_by_batch_size", 1, 1 << 20, 8))
    if method == "ngram":
        cfg.prompt_lookup_max = _int(d, "prompt_lookup_max", 1, 64, 5)
        cfg.prompt_lookup_min = _int(d, "prompt_lookup_min", 1, cfg.prompt_lookup_max, min(2, cfg.prompt_lookup_max))
    elif method == "draft_model":
        if not isinstance(d.get("model"), str):
            raise UserError("speculative_config with method 'draft_model' needs 'model': a checkpoint path (or 'tiny-...' name) "
                            "that shares the target's tokenizer.")
        cfg.model = d["model"]
    else:
        rate = d.get("acceptance_rate", 1.0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise UserError(f"speculative_config['acceptance_rate'] must be a number in [0, 1], got {rate!r}.")
        if not isinstance(d.get("reference"), dict):
            raise UserError("speculative_config with method 'replay' needs 'reference': {prompt ids tuple: the target's tokens}.")
        cfg.acceptance_rate, cfg.reference = float(rate), d["reference"]
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if key in d and method != "ngram":
            raise UserError(f"speculative_config[{key!r}] only applies to method 'ngram' (given with {method!r}).")
    return cfg
