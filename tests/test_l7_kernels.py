"""Stage 7 groundwork: each fused kernel against its torch reference (the split-KV attention:
tests/test_l7_split_kv.py).

Expected values come from the torch path the kernel replaces (l1_dense's RMSNorm, MLP
expression, apply_rope and Attention's q/k norm; l3_paged's set_kv), never from the kernel. On a
CPU the kernels run through the Triton interpreter in float32 and float16. No bfloat16 there:
triton 3.9's interpreter truncates float32 -> bfloat16 casts (the GPU rounds to nearest even) and
its bf16 tl.dot is wrong, so bf16 runs on the GPU only (`-m gpu`).
"""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import l7_fast  # noqa: F401  (sets TRITON_INTERPRET on CPU before triton is imported)
from l1_dense.config import PRESETS, ModelConfig
from plumbing.errors import UserError
from l1_dense.model import RMSNorm
from benchmarks.kernel_bench import fraction_equal
from l7_fast.fused_act import silu_mul, silu_mul_ref
from l7_fast.fused_norm import add_rms_norm, add_rms_norm_ref, rms_norm
from l7_fast.fused_rope import qk_norm_rope_write, qk_norm_rope_write_ref, rope_case
from l7_fast.gemv import gemv

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (CI is CPU-only)")
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
CPU_DTYPES = [F32, F16]

# Tolerances (atol = rtol), kernel vs the torch path on the same rounded inputs:
TOL = {
    F32: 1e-5,     # only the float32 summation order (and Triton's rsqrt / exp) differ
    F16: 1e-3,     # one fp16 ulp (2^-11 relative) where a float32 difference crosses a rounding edge
    BF16: 1.5e-2,  # one bf16 ulp is 2^-8 relative
}
# Where the kernel rounds at torch's points, nearly every element is bit-equal (measured: 1.0 in
# fp16 on the CPU). Rounding at other points (e.g. weight * x in float32, then one cast) leaves
# only ~74% equal (measured on random data, fp16 and bf16), while staying inside the tolerance.
SAME_ROUNDING = 0.99


def _dtype_params(gpu_dtypes=(BF16,)):
    """CPU dtypes everywhere, plus GPU-only ones marked `gpu` (skipped on a CPU machine)."""
    return CPU_DTYPES + [pytest.param(t, marks=[pytest.mark.gpu, requires_cuda]) for t in gpu_dtypes]


def _ids(t):
    return str(t)[6:]


# --- RMSNorm and residual add -----------------------------------------------------------------
def _norm(N, dtype, seed=0):
    torch.manual_seed(seed)
    norm = RMSNorm(N, 1e-6).to(device=DEVICE, dtype=dtype).requires_grad_(False)
    norm.weight.copy_(torch.randn(N))
    return norm


@pytest.mark.parametrize("N", [64, 100, 1024])
@pytest.mark.parametrize("dtype", _dtype_params(), ids=_ids)
def test_l7_add_rms_norm_matches_l1_decoder_layer_rounding(dtype, N):
    """residual + x is rounded to the model dtype exactly as torch adds; the norm rounds where
    l1's RMSNorm rounds (normalise in float32, cast, then * weight)."""
    norm = _norm(N, dtype)
    x, res = (torch.randn(9, N, device=DEVICE).to(dtype) for _ in range(2))
    out, h = add_rms_norm(x, res, norm.weight, norm.eps)
    ref, h_ref = add_rms_norm_ref(x, res, norm)
    assert torch.equal(h, h_ref)
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype])
    if dtype != F32:
        assert fraction_equal(out, ref) >= SAME_ROUNDING
    plain = rms_norm(x, norm.weight, norm.eps)
    torch.testing.assert_close(plain, norm(x), atol=TOL[dtype], rtol=TOL[dtype])


def test_l7_add_rms_norm_in_place_on_strided_rows():
    """x as a view into a wider tensor (row stride != N); residual updated in place, out into x."""
    norm = _norm(48, F32)
    wide = torch.randn(5, 80, device=DEVICE)
    x = wide[:, :48]                                                   # [5, 48], stride (80, 1)
    res = torch.randn(5, 48, device=DEVICE)
    ref, h_ref = add_rms_norm_ref(x.clone(), res.clone(), norm)
    out, h = add_rms_norm(x, res, norm.weight, norm.eps, out=x, residual_out=res)
    assert out is x and h is res
    torch.testing.assert_close(x, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(res, h_ref)


def test_l7_rms_norm_rejects_a_weight_in_another_dtype():
    with pytest.raises(UserError, match="weight must be a contiguous"):
        rms_norm(torch.randn(2, 8, device=DEVICE).half(), torch.ones(8, device=DEVICE), 1e-6)


# --- SiLU * mul --------------------------------------------------------------------------------
@pytest.mark.parametrize("I", [48, 200, 3072])
@pytest.mark.parametrize("dtype", _dtype_params(), ids=_ids)
def test_l7_silu_mul_matches_l1_mlp_rounding(dtype, I):
    wide = (4 * torch.randn(6, 2 * I + 16, device=DEVICE)).to(dtype)
    gate_up = wide[:, :2 * I]                                           # row stride 2I + 16
    out, ref = silu_mul(gate_up), silu_mul_ref(gate_up)
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype])
    if dtype != F32:
        assert fraction_equal(out, ref) >= SAME_ROUNDING


# --- small-M GEMV (gemv.py) vs cuBLAS -----------------------------------------------------------
@pytest.mark.parametrize("M,N,K,bias", [(1, 200, 96, True), (3, 64, 300, False), (8, 130, 64, True)])
@pytest.mark.parametrize("dtype", _dtype_params(), ids=_ids)
def test_l7_gemv_matches_f_linear_and_silu_mul(dtype, M, N, K, bias):
    torch.manual_seed(0)
    x = torch.randn(M, K + 8, device=DEVICE).to(dtype)[:, :K]                 # a row stride != K
    w = (torch.randn(2 * N, K, device=DEVICE) / K ** 0.5).to(dtype)
    b = torch.randn(N, device=DEVICE).to(dtype) if bias else None
    torch.testing.assert_close(gemv(x, w[:N], b), F.linear(x, w[:N], b), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(gemv(x, w, silu_mul=True), silu_mul(F.linear(x, w)), atol=TOL[dtype], rtol=TOL[dtype])


def test_l7_gemv_refuses_what_it_does_not_compute():
    x, w = torch.randn(2, 16), torch.randn(8, 16)
    with pytest.raises(UserError, match="1..64 rows"):  # FusedOps sends GEMV_MAX_M; the bench up to 64
        gemv(torch.randn(65, 16), w)
    with pytest.raises(UserError, match="no bias"):
        gemv(x, w, torch.randn(4), silu_mul=True)
    with pytest.raises(UserError, match=r"weight must be \[N, 16\]"):
        gemv(x, w.half())


# --- q/k norm + RoPE + KV write ----------------------------------------------------------------
TINY = ModelConfig(family="qwen3", vocab_size=32, hidden_size=64, intermediate_size=64, num_layers=1,
                   num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=4096, qk_norm=True)
ROPE_CFGS = {
    "qwen3_qknorm": TINY,
    "qwen3_D48": replace(TINY, head_dim=48, num_heads=6, num_kv_heads=1),       # padded halves, GQA 6:1
    "llama3_scaled_rope": replace(TINY, family="llama", qk_norm=False, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=256)),
}


def _rope_run(cfg, T, dtype, heads=None, **case_kw):
    attn, (q, k, v, cos, sin), (kv, kv_ref), slots = rope_case(cfg, T, DEVICE, dtype, **case_kw)
    norm = (dict(q_norm_weight=attn.q_norm.weight, k_norm_weight=attn.k_norm.weight, eps=attn.q_norm.eps)
            if cfg.qk_norm else {})
    out = qk_norm_rope_write(q, k, v, cos, sin, kv.K[0], kv.V[0], slots, heads_per_program=heads, **norm)
    ref = qk_norm_rope_write_ref(attn, q, k, v, cos, sin, kv_ref, slots)
    return out, ref, kv, kv_ref, slots, v


@pytest.mark.parametrize("heads", [None, 1, 2], ids=["default_heads", "1_head", "2_heads"])
@pytest.mark.parametrize("name", list(ROPE_CFGS))
@pytest.mark.parametrize("dtype", _dtype_params(), ids=_ids)
def test_l7_qk_norm_rope_write_matches_l1_attention_and_l3_set_kv(dtype, name, heads):
    """heads per program: the default (all of a kind under the interpreter, 1 on a GPU), the GPU's
    1, and 2 (a last group of q heads only half used with 6 q heads, a kv group with 1 kv head)."""
    cfg = ROPE_CFGS[name]
    out, ref, kv, kv_ref, slots, v = _rope_run(cfg, 7, dtype, heads, num_blocks=3, block_size=4)
    tol = TOL[dtype]
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    torch.testing.assert_close(kv.K[0], kv_ref.K[0], atol=tol, rtol=tol, equal_nan=True)  # NaN = untouched
    assert torch.equal(kv.V[0].isnan(), kv_ref.V[0].isnan())
    assert torch.equal(kv.V[0].view(-1, cfg.num_kv_heads, cfg.head_dim)[slots], v)      # v copied exactly
    if dtype != F32:
        assert fraction_equal(out, ref) >= SAME_ROUNDING


@pytest.mark.gpu
@requires_cuda
def test_l7_qk_norm_rope_write_qwen3_0_6b_shape_bf16():
    cfg = replace(PRESETS["Qwen/Qwen3-0.6B"], num_layers=1)
    out, ref, kv, kv_ref, slots, v = _rope_run(cfg, 300, BF16, num_blocks=32)
    torch.testing.assert_close(out, ref, atol=TOL[BF16], rtol=TOL[BF16])
    torch.testing.assert_close(kv.K[0], kv_ref.K[0], atol=TOL[BF16], rtol=TOL[BF16], equal_nan=True)
    assert fraction_equal(out, ref) >= SAME_ROUNDING


def test_l7_qk_norm_rope_write_skips_negative_slots():
    """slot -1 marks a padding row (a CUDA-graph batch bucket): nothing of it reaches the cache."""
    attn, (q, k, v, cos, sin), (kv, _), slots = rope_case(TINY, 5, DEVICE, F32, num_blocks=2, block_size=4)
    slots[[1, 3]] = -1
    norm = dict(q_norm_weight=attn.q_norm.weight, k_norm_weight=attn.k_norm.weight, eps=attn.q_norm.eps)
    qk_norm_rope_write(q, k, v, cos, sin, kv.K[0], kv.V[0], slots, **norm)
    written = (~kv.V[0].view(-1, 2, 32).isnan()).all(-1).all(-1)      # [num_slots] bool
    assert written.sum() == 3 and written[slots[[0, 2, 4]]].all()


@pytest.mark.parametrize("tokens", [None, 1], ids=["default_tokens", "1_token"])
def test_l7_qk_norm_rope_write_blocks_of_tokens_with_padding_rows(tokens):
    """150 tokens: three programs of 64 under the interpreter (the last part-filled), or the GPU's
    one token a program; every 7th row a padding row (slot -1). q matches the torch path on every
    row; each real row's k and v reach its slot; a padding row's slot stays untouched (NaN)."""
    attn, (q, k, v, cos, sin), (kv, kv_ref), slots = rope_case(TINY, 150, DEVICE, F32, num_blocks=40, block_size=4)
    norm = dict(q_norm_weight=attn.q_norm.weight, k_norm_weight=attn.k_norm.weight, eps=attn.q_norm.eps)
    want_q = qk_norm_rope_write_ref(attn, q, k, v, cos, sin, kv_ref, slots)
    pad = torch.arange(150, device=DEVICE) % 7 == 3
    got_q = qk_norm_rope_write(q, k, v, cos, sin, kv.K[0], kv.V[0], torch.where(pad, -1, slots),
                               tokens_per_program=tokens, **norm)
    torch.testing.assert_close(got_q, want_q, atol=TOL[F32], rtol=TOL[F32])
    for got, want in ((kv.K[0], kv_ref.K[0]), (kv.V[0], kv_ref.V[0])):
        got, want = got.view(-1, 2, 32), want.view(-1, 2, 32)
        torch.testing.assert_close(got[slots[~pad]], want[slots[~pad]], atol=TOL[F32], rtol=TOL[F32])
        assert got[slots[pad]].isnan().all()


def test_the_kernel_script_checks_each_kernel_and_fails_on_a_planted_bug(monkeypatch, capsys):
    """benchmarks/bench_l7_kernels.py (the kernels' check-then-time script): its check is real."""
    import benchmarks.bench_l7_kernels as script
    assert script.main(["--kernel", "act"]) == 0
    monkeypatch.setattr(script, "silu_mul", lambda x, out=None: silu_mul_ref(x) * 1.01)   # (the GPU timing passes out=)
    assert script.main(["--kernel", "act"]) == 1
    assert "checks: FAIL in act" in capsys.readouterr().out
