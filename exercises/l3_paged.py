"""Lesson 3, build it: the causal limit of paged attention (which keys each query may see).

Replace the stub below with your own ``visible_keys``, then run

    python scripts/exercise.py l3

which runs the project's tests with ``LESSONS_LEARNER=l3``: Path A, the reference
(``l3_paged/attention_ref.py``, ``paged_attention_ref``), then masks its scores with your
function, once per sequence of the batch; the tests compare it with SDPA, with the Triton
kernel (which has its own copy of the rule) and with stage 2's tokens.

Contract
    q_len   int    this step's new query tokens of one sequence (1 for a decode)
    kv_len  int    that sequence's keys, the q_len new ones included (q_len <= kv_len)
    device         where to build the mask
    ->      [q_len, kv_len] torch.bool: True where query i may attend to key j

The rule (lesson 3.2): query i (0-based among the new tokens) attends to keys
0 .. kv_len - q_len + i. It covers a prefill (q_len == kv_len), a decode (q_len == 1) and a
prefill chunk on cached context (1 < q_len < kv_len) alike. torch's ``is_causal=True`` mask is
right for the first case only.
"""
import torch


def visible_keys(q_len: int, kv_len: int, device) -> torch.Tensor:
    raise NotImplementedError("visible_keys: query i sits at absolute position kv_len - q_len + i; which keys j may it see?")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l3_kernel.py::test_l3_reference_causal_mask_is_bottom_right_aligned",
    "tests/test_l3_kernel.py::test_l3_kernel_matches_reference[H4-4_D128_bs12_mixed_float32]",
    "tests/test_l3_paged.py::test_one_mixed_batch_equals_three_single_sequence_runs[torch]",
    "tests/test_l3_paged.py::test_l3_paged_tokens_match_l2_gather_with_scattered_blocks[torch-16]",
]
