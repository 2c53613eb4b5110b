"""Stage 3: the Triton paged-attention kernel (Path B) against the PyTorch reference (Path A).

Expected values always come from attention_ref.py, an independent code path (gather + explicit
mask + softmax in float32), never from the kernel. A representative subset runs on the CPU
through the Triton interpreter (CI); the full sweep is `-m gpu` and needs CUDA.
"""
import pytest
import torch

import l3_paged  # noqa: F401  (sets TRITON_INTERPRET on CPU before triton is imported)
from plumbing.errors import UserError
from l3_paged.attention_ref import paged_attention_ref
from l3_paged.attention_triton import paged_attention_triton
from l3_paged.kernel_config import KernelConfig
from l3_paged.paged_batch import make_paged_batch
from l3_paged.validate import validate_paged_inputs

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (CI is CPU-only)")

# Tolerances (atol = rtol), kernel vs the float32 reference on the same rounded inputs:
TOL = {
    torch.float32: 1e-5,    # fp32 tl.dot with input_precision="ieee": only summation order differs
    torch.float16: 2e-3,    # p is rounded to fp16 before p @ v, plus the output rounding (2^-11)
    torch.bfloat16: 1.5e-2,  # same with an 8-bit mantissa: the output rounding alone is 2^-8 relative
}

# (q_len, kv_len) per sequence. kv_len counts the new tokens; kv_len > q_len is a chunk on cache.
GPU_BATCHES = {
    "decode": [(1, 1328), (1, 17), (1, 512), (1, 1)],
    "prefill": [(18, 18), (257, 257), (300, 300)],     # tokens fill the grid: "prefill" tiles
    "mixed": [(1, 1328), (5, 18), (129, 463)],          # mostly empty grid: "mixed" tiles
}
CPU_BATCHES = {  # the interpreter runs each program in NumPy: keep key counts small
    "decode": [(1, 200), (1, 17), (1, 1)],
    "prefill": [(18, 18), (100, 100)],
    "mixed": [(1, 300), (5, 18), (70, 130)],
}


def _run_and_compare(heads, head_dim, block_size, batch, dtype, **batch_kw):
    H_q, H_kv = heads
    q_lens, kv_lens = zip(*batch)
    args = make_paged_batch(q_lens, kv_lens, H_q, H_kv, head_dim, block_size, dtype, DEVICE, **batch_kw)
    validate_paged_inputs(*args, max_seqlen_q=max(q_lens))
    out = paged_attention_triton(*args, max_seqlen_q=max(q_lens))
    ref = paged_attention_ref(*args)
    assert out.dtype == dtype and out.shape == args[0].shape
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype])
    return args, out


# --- CPU (interpreter) subset: every (heads, head_dim) pair once, with block_size, batch kind
# --- and dtype rotated so each value appears several times. bf16 runs on the interpreter
# --- because the kernel upcasts to fp32 before tl.dot there.
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
HEADS = [(4, 4), (8, 2), (6, 1)]
HEAD_DIMS = [8, 48, 64, 80, 96, 128, 256]
BLOCK_SIZES = [1, 12, 16, 64]
CPU_CASES = [(h, d, BLOCK_SIZES[i % 4], list(CPU_BATCHES)[i % 3], (F32, F16, BF16)[(i // 3 + i) % 3])
             for i, (h, d) in enumerate((h, d) for h in HEADS for d in HEAD_DIMS)]


@pytest.mark.parametrize("heads,head_dim,block_size,kind,dtype", CPU_CASES,
                         ids=[f"H{h[0]}-{h[1]}_D{d}_bs{b}_{k}_{str(t)[6:]}" for h, d, b, k, t in CPU_CASES])
def test_l3_kernel_matches_reference(heads, head_dim, block_size, kind, dtype):
    _run_and_compare(heads, head_dim, block_size, CPU_BATCHES[kind], dtype)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("kind", list(GPU_BATCHES))
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}-{h[1]}")
def test_l3_kernel_matches_reference_full_sweep(heads, head_dim, block_size, kind, dtype):
    _run_and_compare(heads, head_dim, block_size, GPU_BATCHES[kind], dtype)


def test_l3_kernel_causal_edge_correct_at_every_offset_in_a_key_tile():
    """The kernel splits keys into unmasked tiles and masked edge tiles; the split point must be
    right wherever the causal edge falls inside a key tile (16-bit dtypes use BLOCK_N=64, and
    kv_len sweeps 66 consecutive values with decode, 2-token and 40-token chunks)."""
    batch = [((1, 2, 40)[i % 3], 60 + i) for i in range(66)]
    _run_and_compare((8, 2), 16, 16, batch, F16)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}-{h[1]}")
def test_l3_kernel_matches_reference_long_prefill(heads, head_dim, dtype):
    """max_seqlen_q >= 2048 switches to 256-row tiles: check that path, with a chunk on context."""
    _run_and_compare(heads, head_dim, 16, [(2100, 2100), (2050, 2500)], dtype)


@pytest.mark.parametrize("cfg", [KernelConfig(4, 128, 4, 2), KernelConfig(16, 64, 4, 2), KernelConfig(32, 128, 8, 3),
                                 KernelConfig(64, 64, 8, 3), KernelConfig(2, 16, 4, 2)], ids=str)
def test_l3_kernel_output_does_not_depend_on_tile_config(cfg):
    """Every config pick_config can return (decode, mixed, prefill, long prefill, float32) is
    valid for any batch; the CPU runs each on one mixed batch (GPU picks them by shape)."""
    q_lens, kv_lens = zip(*CPU_BATCHES["mixed"])
    args = make_paged_batch(q_lens, kv_lens, 8, 2, 64, 16, F16, DEVICE)
    out = paged_attention_triton(*args, max_seqlen_q=max(q_lens), config=cfg)
    torch.testing.assert_close(out, paged_attention_ref(*args), atol=TOL[F16], rtol=TOL[F16])


def test_l3_kernel_ignores_nan_in_unused_blocks_and_table_padding():
    """Slots past kv_len, spare blocks and padding table entries hold NaN / junk; none may leak."""
    batch = CPU_BATCHES["mixed"]
    q_lens, kv_lens = zip(*batch)
    q, k, v, cu, kv, table = make_paged_batch(q_lens, kv_lens, 8, 2, 64, 12, F32, DEVICE, spare_blocks=4)
    assert torch.isnan(k).any() and torch.isnan(v).any()            # the poison is really there
    n_used = [-(-n // 12) for n in kv_lens]
    spare = sorted(set(range(k.shape[0])) - set(table[table < k.shape[0]].tolist()))
    for s, n in enumerate(n_used):   # point padding entries at NaN-filled spare blocks (valid ids)
        table[s, n:] = spare[s % len(spare)]
    out = paged_attention_triton(q, k, v, cu, kv, table, max_seqlen_q=max(q_lens))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, paged_attention_ref(q, k, v, cu, kv, table), atol=1e-5, rtol=1e-5)


def test_l3_kernel_sequence_output_does_not_depend_on_batch_neighbours():
    """A sequence attends to its own blocks only: alone or batched, same output."""
    batch = CPU_BATCHES["mixed"]
    q_lens, kv_lens = zip(*batch)
    args, out = _run_and_compare((8, 2), 64, 16, batch, F32)
    q, k, v, cu, kv, table = args
    s = 2                                                            # the prefill chunk on context
    alone = paged_attention_triton(q[cu[s]:cu[s + 1]], k, v, torch.tensor([0, q_lens[s]], dtype=torch.int32,
                                   device=DEVICE), kv[s:s + 1], table[s:s + 1], max_seqlen_q=q_lens[s])
    torch.testing.assert_close(alone, out[cu[s]:cu[s + 1]], atol=1e-5, rtol=1e-5)


def test_l3_kernel_reads_strided_q_and_writes_into_out():
    """q as a view into a fused qkv projection (token stride != H_q * D) and a caller-given out."""
    q_lens, kv_lens = zip(*CPU_BATCHES["mixed"])
    q, k, v, cu, kv, table = make_paged_batch(q_lens, kv_lens, 8, 2, 64, 16, F32, DEVICE)
    qkv = torch.randn(q.shape[0], (8 + 2 * 2) * 64, device=DEVICE)
    qkv[:, :8 * 64] = q.reshape(q.shape[0], -1)
    q_view = qkv[:, :8 * 64].view(q.shape[0], 8, 64)                  # [T, H_q, D], stride(0) = 768
    out = torch.full_like(q, float("nan"))
    ret = paged_attention_triton(q_view, k, v, cu, kv, table, max_seqlen_q=max(q_lens), out=out)
    assert ret is out
    torch.testing.assert_close(out, paged_attention_ref(q, k, v, cu, kv, table), atol=1e-5, rtol=1e-5)


def test_l3_reference_causal_mask_is_bottom_right_aligned():
    """The spec itself, checked against torch SDPA where SDPA's masks are right: a full prefill
    equals is_causal=True, a decode token sees every key (no mask)."""
    F = torch.nn.functional
    q, k, v, cu, kv, table = make_paged_batch([7, 1], [7, 9], 4, 4, 16, 4, F32, DEVICE)
    ref = paged_attention_ref(q, k, v, cu, kv, table)

    def dense(s, n):                       # [1, H, n, D] gathered keys/values of sequence s
        j = torch.arange(n, device=DEVICE)
        idx = table[s, j // 4].long() * 4 + j % 4
        return (c.view(-1, 4, 16)[idx].transpose(0, 1)[None] for c in (k, v))
    k0, v0 = dense(0, 7)
    sdpa_prefill = F.scaled_dot_product_attention(q[:7].transpose(0, 1)[None], k0, v0, is_causal=True)
    torch.testing.assert_close(ref[:7], sdpa_prefill[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    k1, v1 = dense(1, 9)
    sdpa_decode = F.scaled_dot_product_attention(q[7:].transpose(0, 1)[None], k1, v1)
    torch.testing.assert_close(ref[7:], sdpa_decode[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


# --- Validation: one case per bad input, each must name the problem. -----------------------
def _good():
    return list(make_paged_batch([1, 5], [9, 7], 4, 2, 16, 4, F32, DEVICE))   # block_size 4


def _set(i, fn):
    def mutate(a):
        a[i] = fn(a[i])
        return a
    return mutate


def _table_entry(value):
    def fn(t):
        t = t.clone()
        t[1, 0] = value
        return t
    return fn


Q, K, V, CU, KV, BT = range(6)
BAD_INPUTS = {
    "block_table_int64": (_set(BT, lambda t: t.long()), r"block_table must be int32.*\.to\(torch\.int32\)"),
    "seq_lens_int64": (_set(KV, lambda t: t.long()), r"seq_lens_kv must be int32"),
    "block_id_too_large": (_set(BT, _table_entry(10_000)), r"block id out of range: block_table\[1, 0\]=10000"),
    "block_id_negative": (_set(BT, _table_entry(-1)), r"block id out of range: block_table\[1, 0\]=-1"),
    "kv_len_below_q_len": (_set(KV, lambda t: torch.tensor([9, 3], dtype=torch.int32, device=t.device)),
                           r"seq_lens_kv\[1\]=3 is smaller than its query length 5"),
    "cu_not_starting_at_0": (_set(CU, lambda t: t + 1), r"cu_seqlens_q must start at 0"),
    "cu_decreasing": (_set(CU, lambda t: torch.tensor([0, 4, 3], dtype=torch.int32, device=t.device)),
                      r"non-decreasing"),
    "cu_last_not_T": (_set(CU, lambda t: torch.tensor([0, 1, 5], dtype=torch.int32, device=t.device)),
                      r"cu_seqlens_q\[-1\]=5 must equal the number of query tokens T=6"),
    "block_table_too_narrow": (_set(BT, lambda t: t[:, :2].contiguous()),
                               r"block_table has 2 columns but sequence 0 .* needs 3 blocks"),
    "q_not_contiguous": (_set(Q, lambda t: torch.cat([t, t], -1)[..., ::2]), r"q is not contiguous"),
    "k_cache_not_contiguous": (_set(K, lambda t: torch.cat([t, t], -1)[..., ::2]), r"k_cache is not contiguous"),
    "cu_not_contiguous": (_set(CU, lambda t: torch.stack([t, t], -1)[:, 0]), r"cu_seqlens_q is not contiguous"),
    "dtype_mismatch": (_set(K, lambda t: t.half()), r"dtype mismatch"),
    "float64_q": (lambda a: [t.double() if i < 3 else t for i, t in enumerate(a)], r"q dtype torch.float64 unsupported"),
    "heads_not_multiple": (_set(Q, lambda t: t[:, :3].contiguous()), r"H_q=3 must be a multiple of H_kv=2"),
    "head_dim_mismatch": (_set(Q, lambda t: t[..., :8].contiguous()), r"head_dim mismatch"),
    "k_cache_flat_layout": (_set(K, lambda t: t.view(-1, 2, 16)), r"k_cache must be \[num_blocks, block_size"),
    "cu_wrong_length": (_set(CU, lambda t: t[:2].contiguous()), r"cu_seqlens_q has 2 entries .* need S\+1"),
    "block_table_wrong_rows": (_set(BT, lambda t: t[:1].contiguous()), r"block_table has 1 rows"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_l3_validate_names_the_bad_input(case):
    mutate, message = BAD_INPUTS[case]
    with pytest.raises(UserError, match=message):
        validate_paged_inputs(*mutate(_good()), max_seqlen_q=5)


def test_l3_validate_names_max_seqlen_q_too_small():
    with pytest.raises(UserError, match=r"max_seqlen_q=4 is smaller than sequence 1's query length 5"):
        validate_paged_inputs(*_good(), max_seqlen_q=4)


def test_l3_validate_accepts_junk_in_table_padding():
    """Entries past ceil(kv_len / block_size) are padding: junk there is legal."""
    a = _good()
    assert (a[BT] >= a[K].shape[0]).any()                           # make_paged_batch pads with junk ids
    validate_paged_inputs(*a, max_seqlen_q=5)


def test_l3_kernel_rejects_int64_block_table_without_sync():
    """The launch path's own (host-only) layout check catches the most common dtype mistake."""
    a = _good()
    a[BT] = a[BT].long()
    with pytest.raises(UserError, match=r"block_table must be int32"):
        paged_attention_triton(*a, max_seqlen_q=5)


@pytest.mark.parametrize("block_size", [16, 64])
def test_prefill_tma_peer_matches_reference(block_size):
    """benchmarks/studies/prefill_tma.py (bench_prefill.py's TMA peer) computes stage 3's attention."""
    from benchmarks.studies.prefill_tma import prefill_tma
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float16
    args = make_paged_batch([64], [64], 4, 2, 16, block_size, dtype, dev, spare_blocks=2)
    out = prefill_tma(args[0], args[1], args[2], args[5], block_m=16, block_n=16, num_warps=4, num_stages=1)
    ref = paged_attention_ref(*args)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2 if dev == "cuda" else 2e-3, rtol=0)
