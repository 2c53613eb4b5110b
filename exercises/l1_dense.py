"""Lesson 1, build it: rotary position embeddings (RoPE).

Replace the stub below with your own ``apply_rope``, then run

    python scripts/exercise.py l1

which runs the project's tests with ``LESSONS_LEARNER=l1``: the model then calls your function,
for q and for k, in every layer (``l1_dense/model.py``, ``Attention.forward``).

Contract
    x    [T, H, D]   one head vector per token and head (q or k), any float dtype
    cos  [T, D]      cos(position * inv_freq) of each token, the D/2 angles written twice: [a, a]
    sin  [T, D]      the same with sin
    ->   [T, H, D]   x rotated, same dtype

RoPE rotates the pair (x[i], x[i + D/2]) by the angle of column i, for i < D/2 (the "rotate
half" convention of Hugging Face checkpoints; *not* the interleaved pairs (2i, 2i+1)):

    out[i]       = x[i] * cos[i] - x[i + D/2] * sin[i]
    out[i + D/2] = x[i + D/2] * cos[i] + x[i] * sin[i]

cos and sin hold one row per token, shared by all H heads. Use torch only (no import from
l1_dense: this file is loaded while l1_dense/model.py is being imported).
"""
import torch


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("apply_rope: rotate the pairs (x[i], x[i + D/2]) by cos/sin, broadcast over the H heads")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l1_dense.py::test_l1_dense_tokens_match_hf_generate_exactly",
]
