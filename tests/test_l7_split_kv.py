"""Stage 7's split-KV decode attention (l7_fast/attention_split.py) against stage 3's reference
(l3_paged's attention_ref), never against the kernel; the fused kernels: tests/test_l7_kernels.py.

The split cases really split (the fallback to stage 3's kernel is made to fail), a planted merge
that forgets to rescale each split is caught, and prefill chunks and one split fall back to stage
3's kernel. On a CPU through the Triton interpreter in float32 and float16; bfloat16 and the GPU's
own tiles on the GPU only (`-m gpu`, for the reason in tests/test_l7_kernels.py).
"""
import pytest
import torch

import l7_fast  # noqa: F401  (sets TRITON_INTERPRET on CPU before triton is imported)
from plumbing.errors import UserError
from l3_paged.attention_ref import paged_attention_ref
from l3_paged.attention_triton import paged_attention_triton
from l3_paged.kernel_config import KernelConfig
from l3_paged.paged_batch import make_paged_batch
from l7_fast import attention_split
from l7_fast.attention_split import paged_attention_split, pick_num_splits
from test_l7_kernels import BF16, CPU_DTYPES, DEVICE, F16, F32, TOL, _ids, requires_cuda

ATTN_TOL = {**TOL, F16: 2e-3}   # attention: p is rounded to fp16 before p @ v (stage 3's tolerance)


# --- split-KV decode attention ------------------------------------------------------------------
# (heads, head_dim, block_size, kv_lens, num_splits). Interpreter tiles: BLOCK_N = 32 keys, so
# 100 keys already make 4 key tiles and several splits.
SPLIT_CASES = {
    "several_splits": ((8, 2), 64, 16, [300], 4),                        # chunk 96: 96+96+96+12
    "uneven_last_split": ((8, 2), 64, 12, [250, 97], 3),                 # chunks 96 / 64, last short
    "gqa_6_1_D80": ((6, 1), 80, 16, [200, 33], 5),                       # non-pow2 G and D
    "mha_4_4_bs1": ((4, 4), 32, 1, [130], 2),
    "shorter_than_one_split": ((8, 2), 64, 16, [700, 5, 1, 40], 8),      # 5, 1, 40 keys: 1 split
    "more_splits_than_tiles": ((8, 2), 64, 16, [100], 16),               # only 4 splits run
}
CPU_SPLIT_CONFIG = KernelConfig(1, 32, 4, 2)
GPU_SPLIT_CASES = {
    "qwen3_0.6b_1x4096": ((16, 8), 128, 16, [4096], None),
    "qwen3_0.6b_3_mixed_lengths": ((16, 8), 128, 16, [5000, 17, 1328], 8),
    "gqa_6_1_D80": ((6, 1), 80, 16, [2000, 33], 5),
    "qwen3_8b_heads_bs12": ((32, 8), 128, 12, [3001], 7),
}


def _split_run(heads, head_dim, block_size, kv_lens, num_splits, dtype, config=None):
    args = make_paged_batch([1] * len(kv_lens), kv_lens, *heads, head_dim, block_size, dtype, DEVICE)
    out = paged_attention_split(*args, max_seqlen_q=1, num_splits=num_splits, config=config)
    assert out.dtype == dtype and torch.isfinite(out).all()            # NaN-poisoned unused slots
    return out, paged_attention_ref(*args)


@pytest.fixture
def no_stage3_kernel(monkeypatch):
    """The split cases must really split: the fallback to stage 3's kernel is made to fail."""
    def fail(*a, **k):
        raise AssertionError("took the unsplit fallback")
    monkeypatch.setattr(attention_split, "paged_attention_triton", fail)


@pytest.mark.parametrize("case", list(SPLIT_CASES))
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=_ids)
def test_l7_split_kv_matches_reference(dtype, case, no_stage3_kernel):
    out, ref = _split_run(*SPLIT_CASES[case], dtype, config=CPU_SPLIT_CONFIG)
    torch.testing.assert_close(out, ref, atol=ATTN_TOL[dtype], rtol=ATTN_TOL[dtype])


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("case", list(GPU_SPLIT_CASES))
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=_ids)
def test_l7_split_kv_matches_reference_gpu_tiles(dtype, case, no_stage3_kernel):
    """The GPU's own tiles (stage 3's decode config); None = the automatic split count."""
    out, ref = _split_run(*GPU_SPLIT_CASES[case], dtype)
    torch.testing.assert_close(out, ref, atol=ATTN_TOL[dtype], rtol=ATTN_TOL[dtype])


def _torch_merge(lse_correct):
    """A merge in torch over the split kernel's partials; every split valid in the case used."""
    def merge(acc, m, l, out, seq_lens_kv, num_splits, block_n, pdl=False):   # acc [S, H_q, n, D], m/l [S, H_q, n]
        if lse_correct:
            w = torch.exp2(m - m.amax(-1, keepdim=True))             # rescale to the common max
        else:
            w = torch.ones_like(m)                                    # planted bug: forget the rescale
        out.copy_(((acc * w[..., None]).sum(2) / (l * w).sum(2)[..., None]).to(out.dtype))
    return merge


@pytest.mark.parametrize("lse_correct", [True, False], ids=["torch_lse_merge", "planted_unscaled_merge"])
def test_l7_split_kv_tests_catch_a_wrong_merge(monkeypatch, no_stage3_kernel, lse_correct):
    """The partials are right (a torch log-sum-exp merge of them passes) and the test is sharp
    enough to see a merge that forgets to rescale each split to the common max: it fails."""
    monkeypatch.setattr(attention_split, "_merge", _torch_merge(lse_correct))
    out, ref = _split_run(*SPLIT_CASES["several_splits"], F32, config=CPU_SPLIT_CONFIG)
    if lse_correct:
        torch.testing.assert_close(out, ref, atol=TOL[F32], rtol=TOL[F32])
    else:
        with pytest.raises(AssertionError):
            torch.testing.assert_close(out, ref, atol=TOL[F32], rtol=TOL[F32])


def test_l7_split_kv_falls_back_to_stage3_for_prefill_and_one_split():
    """Prefill chunks (max_seqlen_q > 1) and num_splits == 1 are stage 3's kernel, same output."""
    args = make_paged_batch([1, 5], [40, 20], 8, 2, 32, 16, F32, DEVICE)
    for kw in (dict(max_seqlen_q=5), dict(max_seqlen_q=5, num_splits=4)):
        torch.testing.assert_close(paged_attention_split(*args, **kw),
                                   paged_attention_triton(*args, max_seqlen_q=5), atol=0, rtol=0)
    dec = make_paged_batch([1], [40], 8, 2, 32, 16, F32, DEVICE)
    torch.testing.assert_close(paged_attention_split(*dec, max_seqlen_q=1, num_splits=1),
                               paged_attention_triton(*dec, max_seqlen_q=1), atol=0, rtol=0)


def test_l7_pick_num_splits_from_host_ints():
    """Split while the unsplit grid leaves SMs idle; never below MIN_KEYS_PER_SPLIT keys a split."""
    sms = 132                                                          # H200
    assert pick_num_splits(1, 8, 32768, sms) > 8                       # 8 programs on 132 SMs
    assert pick_num_splits(8, 8, 8192, sms) > 1
    assert pick_num_splits(64, 8, 4096, sms) == 1                      # 512 programs: already full
    assert pick_num_splits(1, 8, 127, sms) == 1                        # too few keys to share (< 2 x 64)
    assert pick_num_splits(1, 8, 32768, sms) <= 32768 // attention_split.MIN_KEYS_PER_SPLIT


def test_l7_split_kv_rejects_a_bad_split_count():
    args = make_paged_batch([1], [40], 4, 2, 16, 16, F32, DEVICE)
    with pytest.raises(UserError, match="num_splits must be a host int"):
        paged_attention_split(*args, max_seqlen_q=1, num_splits=0)
