"""Stage 9's kernels: the e4m3 bits by hand, the quantizing K/V write, and attention over an
e4m3 cache (whole and split, with and without a window) against their references."""
import pytest
import torch

import l9_fp8_kv  # noqa: F401  (sets TRITON_INTERPRET on CPU before triton is imported)
from l3_paged.paged_batch import make_paged_batch
from l8_sliding_window.attention import poison_below_window
from l9_fp8_kv import fp8_attention_ref, paged_attention_fp8, paged_attention_fp8_split, quantize_kv
from l9_fp8_kv.attention import quantize_batch
from l9_fp8_kv.e4m3 import e4m3_decode, e4m3_encode
from plumbing.errors import UserError

import triton
import triton.language as tl

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [(torch.float32, 1e-4), (torch.float16, 3e-3)] + ([(torch.bfloat16, 2e-2)] if DEV == "cuda" else [])
BATCHES = {"mixed": ([1, 5, 33], [300, 5, 90]), "decodes": ([1, 1, 1], [17, 64, 129])}


@triton.jit
def _roundtrip(x_ptr, bits_ptr, back_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(bits_ptr + i, e4m3_encode(tl.load(x_ptr + i)))
    tl.store(back_ptr + i, e4m3_decode(tl.load(bits_ptr + i)))


@triton.jit
def _decode(bits_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, e4m3_decode(tl.load(bits_ptr + i)))


def test_l9_hand_e4m3_equals_torch_for_every_code_and_rounding_case():
    """Every code decodes to torch's value (NaN included), and encoding random values across the
    whole range (subnormals, ties, carries into the next exponent, 448) gives torch's code."""
    from l9_fp8_kv import e4m3
    N = 1 << 14
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(N, generator=g) * torch.exp2(torch.randint(-14, 9, (N,), generator=g).float())).clamp(-448, 448)
    x[:256] = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().nan_to_num(0.0)   # every value
    x[256:264] = torch.tensor([15.5, 0.5 * 2 ** -9, 1.5 * 2 ** -9, 2.5 * 2 ** -9, 448.0, -31.25, 0.0, 1.0625])
    x = x.to(DEV)
    bits, back = torch.empty(N, dtype=torch.uint8, device=DEV), torch.empty(N, device=DEV)
    _roundtrip[(1,)](x, bits, back, N=N)                   # the GPU runs the same arithmetic, compiled
    want = x.to(e4m3.FP8)
    assert torch.equal(bits.view(e4m3.FP8).float(), want.float())
    assert torch.equal(back, want.float())
    codes = torch.arange(256, dtype=torch.uint8, device=DEV)
    decoded = torch.empty(256, device=DEV)
    _decode[(1,)](codes, decoded, N=256)
    want = codes.view(e4m3.FP8).float()
    assert torch.equal(decoded.isnan(), want.isnan()) and decoded.isnan().sum() == 2    # 0x7F, 0xFF; no infinity
    assert torch.equal(decoded.nan_to_num(0.0), want.nan_to_num(0.0))


def test_l9_quantize_kv_saturates_rounds_and_scales():
    x = torch.tensor([[[1000.0, -1000.0, 0.5, 0.0]], [[0.0, 0.0, 0.0, 0.0]], [[3.0, -6.0, 1.5, 0.75]]])
    codes, s = quantize_kv(x, torch.ones(3, 1))
    assert codes[0, 0].float().tolist() == [448.0, -448.0, 0.5, 0.0]          # clamped, never NaN
    codes, s = quantize_kv(x, None)
    assert torch.equal(s.flatten(), torch.tensor([1000.0, 448.0, 6.0]) / 448)                # amax / 448; all-zero: 1
    assert codes[2, 0].float().tolist() == [224.0, -448.0, 112.0, 56.0]
    back = codes.float() * s[..., None]
    assert (back - x).abs().max() <= 1000 / 448 * 16                         # half a step at 448 (32 / 2)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("per_token", [False, True], ids=["tensor", "token_head"])
def test_l9_write_kernel_stores_the_references_codes_and_scales(dtype, tol, per_token):
    """The fused norm + RoPE + quantize + write against stage 7's torch path into an Fp8KVCache
    (set_kv -> quantize_kv): the same codes and scales, and stage 7's q."""
    from l1_dense.config import PRESETS
    import dataclasses
    from l7_fast.fused_rope import qk_norm_rope_write_ref, rope_case
    from l8_sliding_window.groups import kv_cache_groups
    from l9_fp8_kv import Fp8KVCache, rope_write_fp8
    cfg = dataclasses.replace(PRESETS["Qwen/Qwen3-0.6B"], num_heads=4, num_kv_heads=2, head_dim=32, num_layers=1)
    attn, (q, k, v, cos, sin), _, slots = rope_case(cfg, 12, DEV, dtype, num_blocks=4)
    k.mul_(20)                                                         # some values past 448 before the norm
    caches = [Fp8KVCache(cfg, kv_cache_groups((), 1), 4, 16, DEV, dtype, per_token=per_token) for _ in range(2)]
    want_q = qk_norm_rope_write_ref(attn, q, k, v, cos, sin, caches[0], slots)
    c = caches[1]
    got_q = rope_write_fp8(q, k, v, cos, sin, c.K[0], c.V[0], c.k_scale[0], c.v_scale[0], slots, per_token=per_token,
                           q_norm_weight=attn.q_norm.weight, k_norm_weight=attn.k_norm.weight, eps=attn.q_norm.eps)
    torch.testing.assert_close(got_q, want_q, atol=tol, rtol=tol)
    for got, want in ((c.K[0], caches[0].K[0]), (c.V[0], caches[0].V[0])):
        same = got.view(torch.uint8) == want.view(torch.uint8)
        # fp32: identical bytes; 16-bit: the roped k may differ from torch's in its last bit, so a
        # code may sit one step away (stage 7's own tolerance), never more
        assert same.float().mean() >= (1.0 if dtype == torch.float32 else 0.98)
        assert (got.float() - want.float()).abs().max() <= want.float().abs().max() / 8
    if per_token:
        torch.testing.assert_close(c.k_scale[0], caches[0].k_scale[0], atol=0, rtol=tol)


def test_l9_write_kernel_blocks_of_tokens_with_padding_rows():
    """100 tokens (two interpreter programs of 64, the last part-filled; one token a program on a
    GPU), every 7th a padding row (slot -1): real rows get the torch path's codes and per-token
    scales; a padding row's slot keeps its codes and its scale."""
    from l1_dense.config import PRESETS
    import dataclasses
    from l7_fast.fused_rope import qk_norm_rope_write_ref, rope_case
    from l8_sliding_window.groups import kv_cache_groups
    from l9_fp8_kv import Fp8KVCache, rope_write_fp8
    cfg = dataclasses.replace(PRESETS["Qwen/Qwen3-0.6B"], num_heads=4, num_kv_heads=2, head_dim=32, num_layers=1)
    attn, (q, k, v, cos, sin), _, slots = rope_case(cfg, 100, DEV, torch.float32, num_blocks=8)
    caches = [Fp8KVCache(cfg, kv_cache_groups((), 1), 8, 16, DEV, torch.float32, per_token=True) for _ in range(2)]
    want_q = qk_norm_rope_write_ref(attn, q, k, v, cos, sin, caches[0], slots)
    c = caches[1]
    c.K[0].view(torch.uint8).fill_(0x11)                               # a padding row's slot must keep these
    c.k_scale[0].fill_(7.0)
    pad = torch.arange(100, device=DEV) % 7 == 3
    got_q = rope_write_fp8(q, k, v, cos, sin, c.K[0], c.V[0], c.k_scale[0], c.v_scale[0], torch.where(pad, -1, slots),
                           per_token=True, q_norm_weight=attn.q_norm.weight, k_norm_weight=attn.k_norm.weight,
                           eps=attn.q_norm.eps)
    torch.testing.assert_close(got_q, want_q, atol=1e-4, rtol=1e-4)
    got, want = c.K[0].view(-1, 2, 32).view(torch.uint8), caches[0].K[0].view(-1, 2, 32).view(torch.uint8)
    assert torch.equal(got[slots[~pad]], want[slots[~pad]])
    assert (got[slots[pad]] == 0x11).all()
    ks, ks_want = c.k_scale[0].view(-1, 2), caches[0].k_scale[0].view(-1, 2)
    torch.testing.assert_close(ks[slots[~pad]], ks_want[slots[~pad]], atol=0, rtol=1e-6)
    assert (ks[slots[pad]] == 7.0).all()


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("per_token", [False, True], ids=["tensor", "token_head"])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("window", [None, 20])
def test_l9_kernel_matches_reference_and_never_reads_a_freed_block(dtype, tol, per_token, batch, window):
    q_lens, kv_lens = BATCHES[batch]
    base = make_paged_batch(q_lens, kv_lens, 4, 2, 32, 16, dtype, DEV)
    base[1].mul_(torch.exp2(torch.randint(-6, 6, base[1].shape[:3], device=DEV).to(dtype))[..., None])
    args = quantize_batch(base, per_token, (0.5, 2.0))        # per tensor: scales the kernel must apply
    ref = fp8_attention_ref(*args, window=window)
    if window:                       # NaN codes in every block below the window: a kernel that loads one fails
        poison_below_window(args[:3] + args[5:], q_lens, window)
    out = paged_attention_fp8(*args, max_seqlen_q=max(q_lens), window=window)
    assert not ref.isnan().any() and not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("per_token", [False, True], ids=["tensor", "token_head"])
@pytest.mark.parametrize("window", [None, 37])
def test_l9_split_kernel_matches_reference(dtype, tol, per_token, window):
    q_lens, kv_lens = [1, 1, 1, 1], [17, 64, 129, 300]
    base = make_paged_batch(q_lens, kv_lens, 4, 2, 32, 16, dtype, DEV)
    args = quantize_batch(base, per_token, (0.5, 2.0))
    ref = fp8_attention_ref(*args, window=window)
    if window:
        poison_below_window(args[:3] + args[5:], q_lens, window)
    out = paged_attention_fp8_split(*args, max_seqlen_q=1, num_splits=3, window=window)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_l9_reference_is_stage8_on_the_dequantized_cache():
    """The spec's one step: dequantize, then stage 8 (so 'fp8 attention' adds no rule of its own)."""
    from l8_sliding_window import window_attention_ref
    args = quantize_batch(make_paged_batch([3, 1], [40, 20], 4, 2, 32, 16, torch.float32, "cpu"), True)
    q, kc, vc, ks, vs, cu, lens, table = args
    k, v = kc.float() * ks[..., None], vc.float() * vs[..., None]
    torch.testing.assert_close(fp8_attention_ref(*args, window=7),
                               window_attention_ref(q, k, v, cu, lens, table, window=7), atol=0, rtol=0)


def test_l9_kernel_refuses_a_model_dtype_cache():
    base = make_paged_batch([1], [8], 4, 2, 32, 16, torch.float32, "cpu")
    ones = torch.ones(base[1].shape[:3])
    with pytest.raises(UserError, match="float8_e4m3fn"):
        paged_attention_fp8(base[0], base[1], base[2], ones, ones, *base[3:], max_seqlen_q=1)


def test_l9_cache_splits_decode_keys_into_at_most_waves_programs_per_sm():
    """The runner asks its cache for a decode step's split count (l7_fast/cache.py): stage 9's e4m3
    cache never asks for more than WAVES programs per SM (a partial last wave measured slower on an
    H100), stage 7's bf16 cache rounds up (to a power of two). Qwen3-8B's 8 KV heads on 132 SMs."""
    from types import SimpleNamespace
    from l7_fast.attention_split import WAVES, pick_num_splits
    from l7_fast.cache import FastKVCache
    from l9_fp8_kv.cache import Fp8KVCache
    fake = SimpleNamespace(K=[torch.empty(1, 16, 8, 128, dtype=torch.float8_e4m3fn)])   # 8 KV heads
    fp8 = lambda b, ctx: Fp8KVCache.num_splits(fake, b, ctx, 132)         # noqa: E731
    bf16 = lambda b, ctx: FastKVCache.num_splits(fake, b, ctx, 132)        # noqa: E731
    assert (fp8(8, 8192), bf16(8, 8192)) == (6, 8)                         # 396 programs fit: 6 x 64, not 7 or 8 x 64
    assert fp8(64, 4096) == bf16(64, 4096) == 1                            # 512 programs: no split
    for b in (1, 2, 4, 8, 16):
        assert b * 8 * fp8(b, 32768) <= WAVES * 132 < b * 8 * bf16(b, 32768) + b * 8
    assert pick_num_splits(8, 8, 8192, 132) == bf16(8, 8192)               # stage 7 unchanged


def test_fp8_decode_study_variants_compute_the_same_decode(tmp_path):
    """benchmarks/studies/fp8_decode_study.py's kernel variants (lesson 9's "why not 2x") are each checked
    against stage 9's reference (all but "e4m3 dots" on a CPU: the interpreter's e4m3 casts are
    off); a variant that computes something else makes it exit 1. ``--quick`` is the CPU's check
    (float32, tiny); on a GPU the study is its full bf16 run (docs/benchmarks.md, stage 9)."""
    from plumbing.runtime import INTERPRET
    if not INTERPRET:
        pytest.skip("--quick is the interpreter's check (float32, its tolerances); on a GPU the study runs in full")
    from benchmarks.studies.fp8_decode_study import main
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "fp8_decode_study.json").exists()
