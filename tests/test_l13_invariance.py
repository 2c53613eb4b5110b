"""Stage 13's kernels are batch-invariant: a row computed alone and the same row inside other
batches are the same bits (l13_batch_invariant/matmul.py, attention.py).

On a CPU through the Triton interpreter in float32 (its tl.dot is wrong on bfloat16): every tile
shape is then one NumPy matmul shape, so what the tests see is the reduction ORDER, which is what
the kernels fix. Each invariance check is run once on a planted batch-dependent choice (a K step
from M, a split size from the batch) and must fail there. The GPU in bfloat16: tests/test_l13_gpu.py.
"""
import pytest
import torch

import plumbing.runtime  # noqa: F401  (sets TRITON_INTERPRET on CPU before triton is imported)
from plumbing.errors import UserError
from l3_paged.attention_ref import paged_attention_ref
from l3_paged.paged_batch import make_paged_batch
from l13_batch_invariant.attention import paged_attention_invariant, splits_for
from l13_batch_invariant.matmul import matmul

F32 = torch.float32


# --- the matmul ---------------------------------------------------------------------------------
def _mm_case(seed=0, M=6, N=32, K=320):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)


def rows_differ(mm, x, w, b, sizes=(1, 3, 6)) -> list[int]:
    """The M's whose rows differ, in any bit, from the same rows computed in a step of M = 1 each."""
    alone = torch.cat([mm(x[i:i + 1], w, b) for i in range(x.shape[0])])       # [M, N], a row at a time
    return [m for m in sizes if not torch.equal(mm(x[:m], w, b), alone[:m])]


def test_l13_matmul_rows_are_the_same_bits_in_every_M_fold_or_split():
    x, w, b = _mm_case()
    for split in (False, True):        # K = 320 in chunks of 128: three chunks, the last one short
        assert rows_differ(lambda x, w, b: matmul(x, w, b, split=split, k_chunk=128), x, w, b) == []
    folded, split = matmul(x, w, b, split=False, k_chunk=128), matmul(x, w, b, split=True, k_chunk=128)
    assert torch.equal(folded, split)                              # the host's choice changes no bit
    torch.testing.assert_close(folded, torch.nn.functional.linear(x, w, b), atol=1e-4, rtol=1e-5)


def test_l13_matmul_check_fails_on_a_K_step_chosen_from_M():
    x, w, b = _mm_case()
    planted = lambda x, w, b: matmul(x, w, b, k_chunk=128, block_k=32 if x.shape[0] < 4 else 64)   # noqa: E731
    assert rows_differ(planted, x, w, b) != [], "the check passed a K step that depends on M"


def test_l13_matmul_refuses_bad_input_in_one_line():
    x, w, b = _mm_case()
    for bad in (lambda: matmul(x[:, :10], w), lambda: matmul(x.half(), w), lambda: matmul(x, w, b[:3]),
                lambda: matmul(x.t(), w.t().contiguous().t()), lambda: matmul(x, w, k_chunk=100)):
        with pytest.raises(UserError):
            bad()


# --- the attention ------------------------------------------------------------------------------
SMALL = dict(split_keys=64, block_n=32, rows=16)     # interpreter-sized: 200 keys make 4 splits
H_Q, H_KV, D, BS = 4, 2, 32, 16


def _one(q, K, V, bt, q_rows, kv_len, splits=1, **kw):
    """One sequence's rows, alone: q_rows [n, H_q, D] are its last n tokens, kv_len its keys."""
    n = q_rows.shape[0]
    i32 = dict(dtype=torch.int32)
    return paged_attention_invariant(q_rows, K, V, torch.tensor([0, n], **i32), torch.tensor([kv_len], **i32),
                                     bt, max_seqlen_q=n, num_splits=splits, **{**SMALL, **kw})


@pytest.fixture(scope="module")
def batch():
    """A decode, a chunk of 5 on 72 cached keys, and a 200-token prefill, in one step."""
    return make_paged_batch([1, 5, 200], [150, 77, 200], H_Q, H_KV, D, BS, F32, "cpu", seed=1)


@pytest.fixture(scope="module")
def whole(batch):
    q, K, V, cu, kv, bt = batch
    return paged_attention_invariant(q, K, V, cu, kv, bt, max_seqlen_q=200, **SMALL)


def test_l13_attention_matches_stage_3s_reference(batch, whole):
    torch.testing.assert_close(whole, paged_attention_ref(*batch), atol=1e-5, rtol=1e-5)


def test_l13_attention_a_position_is_the_same_bits_as_decode_verify_chunk_or_prefill(batch, whole):
    """Row p of the 200-token prefill (in a batch of three) = that query decoded alone at p, by the
    fold launch and by the split launch, = the last row of a 3-token (verification) step ending at p."""
    q, K, V, cu, kv, bt = batch
    s0, t = cu[2].item(), bt[2:3]
    for p in (63, 64, 199):                                        # split edges: 64, 128, 192
        row = whole[s0 + p]
        assert torch.equal(_one(q, K, V, t, q[s0 + p:s0 + p + 1], p + 1)[0], row), p
        assert torch.equal(_one(q, K, V, t, q[s0 + p:s0 + p + 1], p + 1, splits=4)[0], row), p
        if p >= 2:
            assert torch.equal(_one(q, K, V, t, q[s0 + p - 2:s0 + p + 1], p + 1)[-1], row), p


def _decode_batch_differs(att, q, K, V, kv, bt) -> bool:
    """Sequence 0's decode row alone vs inside a decode step of 3 sequences (split launch)."""
    i32 = dict(dtype=torch.int32)
    rows = []
    for S in (1, 3):
        rows.append(att(q[:S], K, V, torch.arange(S + 1, **i32), kv[:S], bt[:S], S)[0])
    return not all(torch.equal(r, rows[0]) for r in rows)


def test_l13_attention_check_fails_on_a_split_size_chosen_from_the_batch(batch):
    q, K, V, cu, _, bt = batch
    kv = torch.tensor([200, 180, 150], dtype=torch.int32)
    decode_q = q[cu[2].item():cu[2].item() + 3]                   # three decode queries
    fixed = lambda q, K, V, cu, kv, bt, S: paged_attention_invariant(  # noqa: E731
        q, K, V, cu, kv, bt, max_seqlen_q=1, num_splits=4, **SMALL)
    planted = lambda q, K, V, cu, kv, bt, S: paged_attention_invariant(  # noqa: E731  stage 7's rule, in keys
        q, K, V, cu, kv, bt, max_seqlen_q=1, num_splits=4, **{**SMALL, "split_keys": 64 * S})
    table = torch.stack([bt[2], bt[2], bt[2]])                    # three queries on one sequence's keys
    assert not _decode_batch_differs(fixed, decode_q, K, V, kv, table)
    assert _decode_batch_differs(planted, decode_q, K, V, kv, table), "the check passed a split size from the batch"


def test_l13_attention_refuses_bad_input_in_one_line(batch):
    q, K, V, cu, kv, bt = batch
    for bad in (dict(num_splits=0), dict(max_seqlen_q=1.5), dict(split_keys=100)):
        with pytest.raises(UserError):
            paged_attention_invariant(q, K, V, cu, kv, bt, **{"max_seqlen_q": 200, **SMALL, **bad})


@pytest.mark.parametrize("seqs,kv_len", [(1, 200), (3, 130), (2, 40), (8, 200)])
def test_l13_a_split_launch_splits_for_plans_gives_the_fold_launchs_bits(batch, seqs, kv_len):
    """The host plans a decode step's launch (``splits_for``: a step of ``seqs`` sequences on 16 SMs):
    1 (fold) or enough programs for every split of its longest sequence, and either way a query's
    row is the fold launch's bits (here: the 200-token sequence's query at position kv_len - 1)."""
    q, K, V, cu, _, bt = batch
    n = splits_for(seqs, H_KV, kv_len, 16, split_keys=SMALL["split_keys"])
    assert isinstance(n, int) and (n == 1 or n >= -(-kv_len // SMALL["split_keys"])), n
    row = q[cu[2].item() + kv_len - 1:cu[2].item() + kv_len]
    assert torch.equal(_one(q, K, V, bt[2:3], row, kv_len, splits=n), _one(q, K, V, bt[2:3], row, kv_len))
