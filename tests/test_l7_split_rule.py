"""Split-KV's host-side choices (l7_fast/attention_split.py): how many splits, and which key tile.
The H100 sweeps behind them are in the docstrings and in docs/benchmarks.md ("split counts")."""
import pytest
import torch

import l7_fast  # noqa: F401  (sets TRITON_INTERPRET on CPU before triton is imported)
from l7_fast import attention_split
from l7_fast.attention_split import SHORT_SPLIT, WAVES, pick_num_splits, split_config
from plumbing.runtime import INTERPRET

BF16 = torch.bfloat16


def test_l7_split_counts_are_powers_of_two_that_fill_the_gpu():
    """Powers of two cut power-of-two contexts into equal chunks of whole tiles; never fewer than
    WAVES programs an SM; capped by MIN_KEYS_PER_SPLIT keys a split."""
    sms = 132
    for b, ctx in ((1, 4096), (1, 32768), (2, 8192), (8, 8192), (16, 8192)):
        n = pick_num_splits(b, 8, ctx, sms)
        assert n & (n - 1) == 0 and b * 8 * n >= WAVES * sms, (b, ctx, n)
    assert pick_num_splits(1, 8, 4096, sms) == 64 == 4096 // attention_split.MIN_KEYS_PER_SPLIT
    assert pick_num_splits(1, 8, 1000, sms) == 1000 // attention_split.MIN_KEYS_PER_SPLIT   # the cap: not a power of two


def test_l9_e4m3_cache_keeps_its_own_split_floor():
    """Stage 9's rule is its own (measured with 256 keys a split at least, rounded down): stage 7's
    smaller floor must not leak into it."""
    from l9_fp8_kv.attention_split import FP8_MIN_KEYS, fp8_num_splits
    assert fp8_num_splits(1, 8, 4096, 132) == 4096 // FP8_MIN_KEYS == 16
    assert fp8_num_splits(1, 8, 32768, 132) == (WAVES * 132) // 8 == 49


def test_l7_split_tile_on_the_interpreter_is_stage3s_whatever_the_split_length():
    """The interpreter's tile is one fixed tile (pick_config): a split's length must not change it."""
    if not INTERPRET:
        pytest.skip("the interpreter's tile (a CPU test)")
    assert split_config(1, 4, 128, BF16, 64) == split_config(1, 4, 128, BF16, 10 ** 6) == split_config(1, 4, 128, BF16)


@pytest.mark.gpu
def test_l7_split_tile_takes_32_key_steps_only_for_short_splits():
    """split_config on a GPU: 32-key steps where a split holds at most SHORT_SPLIT keys (the H100
    sweep in its docstring), 64 otherwise and without a bound."""
    assert split_config(1, 4, 128, BF16, 64).block_n == split_config(1, 4, 128, BF16, SHORT_SPLIT).block_n == 32
    assert split_config(1, 4, 128, BF16, SHORT_SPLIT + 1).block_n == split_config(1, 4, 128, BF16).block_n == 64
