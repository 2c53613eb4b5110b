"""Stage 8's windowed kernel against its reference, and the reference against its definition."""
import pytest
import torch

import l8_sliding_window  # noqa: F401  (sets TRITON_INTERPRET on CPU before triton is imported)
from l3_paged.attention_ref import paged_attention_ref
from l3_paged.kernel_config import KernelConfig
from l3_paged.paged_batch import make_paged_batch
from l8_sliding_window import paged_attention_window, window_attention_ref, window_keys
from l8_sliding_window.attention import poison_below_window
from plumbing.errors import UserError

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [(torch.float32, 1e-5), (torch.float16, 2e-3)] + ([(torch.bfloat16, 2e-2)] if DEV == "cuda" else [])
BATCHES = {"mixed": ([1, 5, 33], [300, 5, 90]), "prefill": ([70], [70]), "decodes": ([1, 1, 1], [17, 64, 129])}


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("window", [1, 16, 20, 37])
def test_l8_kernel_matches_reference_and_never_reads_below_the_window(dtype, tol, batch, window):
    q_lens, kv_lens = BATCHES[batch]
    args = make_paged_batch(q_lens, kv_lens, 4, 2, 16, 16, dtype, DEV)
    ref = window_attention_ref(*args, window=window)
    poison_below_window(args, q_lens, window)
    out = paged_attention_window(*args, max_seqlen_q=max(q_lens), window=window)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("cfg", [KernelConfig(1, 16, 4, 2), KernelConfig(16, 32, 4, 2), KernelConfig(4, 64, 4, 2)])
def test_l8_kernel_result_does_not_depend_on_the_tile(cfg):
    """Tiles narrower and wider than the window: the three runs (edge, full, edge) cover every case."""
    args = make_paged_batch([33, 1], [90, 50], 4, 2, 16, 16, torch.float32, DEV)
    ref = window_attention_ref(*args, window=7)
    torch.testing.assert_close(paged_attention_window(*args, max_seqlen_q=33, window=7, config=cfg), ref,
                               atol=1e-5, rtol=1e-5)


def test_l8_reference_is_stage3_when_the_window_covers_everything():
    args = make_paged_batch([1, 5, 33], [300, 5, 90], 4, 2, 16, 16, torch.float32, "cpu")
    torch.testing.assert_close(window_attention_ref(*args, window=300), paged_attention_ref(*args), atol=1e-6, rtol=0)


def test_l8_window_rule_is_transformers_overlay():
    """Query at position p sees p - W < j <= p: W keys, itself included (masking_utils.sliding_window_overlay)."""
    from transformers.masking_utils import sliding_window_causal_mask_function
    fn = sliding_window_causal_mask_function(5)
    t = torch.tensor
    want = torch.tensor([[bool(fn(t(0), t(0), t(qi), t(kj))) for kj in range(12)] for qi in range(12)])
    assert torch.equal(window_keys(12, 12, 5, "cpu"), want)
    assert window_keys(12, 12, 5, "cpu").sum(1).max() == 5


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_l8_kernel_refuses_a_bad_window(window):
    args = make_paged_batch([1], [8], 4, 2, 16, 16, torch.float32, "cpu")
    with pytest.raises(UserError, match="window"):
        paged_attention_window(*args, max_seqlen_q=1, window=window)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_splits", [3, 8])
@pytest.mark.parametrize("window", [1, 37, 4096])
def test_l8_split_kernel_matches_reference_and_never_reads_below_the_window(dtype, tol, num_splits, window):
    """Decode-only steps split over the window's keys (l8_sliding_window/attention_split.py)."""
    from l8_sliding_window.attention_split import paged_attention_window_split
    q_lens, kv_lens = [1, 1, 1, 1], [17, 64, 129, 300]
    args = make_paged_batch(q_lens, kv_lens, 4, 2, 16, 16, dtype, DEV)
    ref = window_attention_ref(*args, window=window)
    poison_below_window(args, q_lens, window)
    out = paged_attention_window_split(*args, max_seqlen_q=1, window=window, num_splits=num_splits)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
