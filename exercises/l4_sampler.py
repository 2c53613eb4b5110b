"""Lesson 4, build it: the top-p (nucleus) cut.

Replace the stub below with your own ``top_p_keep``, then run

    python scripts/exercise.py l4

which runs the project's tests with ``LESSONS_LEARNER=l4``: the sampler then calls your
function in step 5 (``l4_sampler/sampler.py``, ``apply_top_k_top_p``), after top-k, on each
row's probabilities sorted in descending order.

Contract
    probs  [B, V] float32   each row sorted descending (a stable sort: ties in token-id order),
                            renormalised after top-k (tokens cut by top-k have probability 0)
    top_p  [B, 1] float32   each row's top_p, in (0, 1]
    ->     [B, V] bool      True for the tokens the row keeps, in the same sorted order

The rule (lesson 4.3): keep a token when the probability mass strictly *before* it is < top_p.
So the first token is always kept, and the nucleus is the smallest set that reaches top_p.
top_p = 1 keeps every token: a float32 running sum can reach 1.0 before the end of a long row,
so test for it explicitly rather than trusting the sum.
"""
import torch


def top_p_keep(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("top_p_keep: keep a token when the mass strictly before it (a running sum) is < top_p")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l4_sampler.py::test_top_p_nucleus_matches_hand_computation",
    "tests/test_l4_sampler.py::test_top_k_ties_kept_by_token_id",
    "tests/test_l4_sampler.py::test_order_top_k_then_top_p_on_renormalised_mass",
    "tests/test_l4_sampler.py::test_seeded_draws_match_processed_distribution_chi_square",
]
