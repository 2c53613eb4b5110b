"""Lesson 7, chapter 6 (lessons/l7_fast/6_gemv.md): the add + RMSNorm computed in the prologue of the GEMV
that reads it.

The expected values come from the two kernels the prologue replaces (fused_norm.add_rms_norm,
then gemv on its output), which tests/test_l7_kernels.py checks against the torch path. CPU:
float32 and float16 through the interpreter, where the prologue rounds at the same points and
the results are bit-equal; bfloat16 on the GPU (`-m gpu`), at the kernels' tolerance.
"""
import pytest
import torch

import l7_fast  # noqa: F401  (sets TRITON_INTERPRET on CPU before triton is imported)
from l4_sampler.params import SamplingParams
from l5_scheduler.config import make_config
from l7_fast import build_engine, ops as fused_ops
from l7_fast.fused_norm import add_rms_norm, rms_norm
from l7_fast.gemv import gemv
from plumbing.errors import UserError

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
GPU = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device (CI is CPU-only)")]
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=GPU)]
TOL = {torch.float32: 0.0, torch.float16: 0.0, torch.bfloat16: 1.5e-2}   # GPU bf16: one ulp, as test_l7_kernels


def _case(M, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype).to(DEVICE)   # noqa: E731
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype).to(DEVICE)
    return r(M, K), r(M, K), nw, r(2 * N, K) / K ** 0.5, r(N)


# K = 300 and 1100: more than one BLOCK_K chunk in the interpreter (256) and, at 1100, on the GPU too
@pytest.mark.parametrize("M,N,K", [(1, 200, 96), (2, 64, 300), (2, 130, 1100)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
def test_l7_norm_prologue_equals_add_rms_norm_then_gemv(dtype, M, N, K):
    h, delta, nw, w, b = _case(M, N, K, dtype)
    x, h_want = add_rms_norm(delta, h, nw, 1e-6)
    h_out = torch.empty_like(h)
    got = gemv(h, w[:N], b, norm_weight=nw, eps=1e-6, delta=delta, residual_out=h_out)
    torch.testing.assert_close(got, gemv(x, w[:N], b), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(h_out, h_want)                       # h + delta, one rounding, written by program 0
    got = gemv(h, w, silu_mul=True, norm_weight=nw, eps=1e-6)   # layer 0's norm: no residual add
    torch.testing.assert_close(got, gemv(rms_norm(h, nw, 1e-6), w, silu_mul=True), atol=TOL[dtype], rtol=TOL[dtype])


def test_l7_norm_prologue_refuses_a_residual_it_would_race_on():
    h, delta, nw, w, _ = _case(2, 16, 32, torch.float32)
    with pytest.raises(UserError, match="new buffer"):      # program 0 writes while the others still read h
        gemv(h, w, norm_weight=nw, delta=delta, residual_out=h)
    with pytest.raises(UserError, match="both delta and residual_out"):
        gemv(h, w, norm_weight=nw, delta=delta)
    with pytest.raises(UserError, match="pass norm_weight"):
        gemv(h, w, delta=delta, residual_out=torch.empty_like(h))


def _run(model, prompts, new=5, **kw):
    cfg = make_config(model.cfg, DEVICE, next(model.parameters()).dtype, block_size=8, num_gpu_blocks_override=16)
    e = build_engine(model, None, cfg, impl="triton", keep_logits=True, **kw)
    ids = [e.add_request({"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=new)) for p in prompts]
    while e.has_unfinished_requests():
        e.step()
    return [(e.requests[i].output_ids, torch.stack(e.requests[i].logits)) for i in ids]


def _same(a, b, tol):
    return all(ta == tb and torch.allclose(la, lb, atol=tol, rtol=tol) for (ta, la), (tb, lb) in zip(a, b))


# The prologue path through the whole engine: one request (M = 1) and two (M = 2), against the norm
# as its own kernel. A planted prologue that forgets the residual add must be told apart.
@pytest.mark.deep
def test_l7_engine_with_norm_prologue_equals_the_norm_kernel(tiny, monkeypatch):
    model, _ = tiny("qwen3")
    prompts = [[5, 9, 31, 7, 2, 11], [40, 41, 42]]
    want = _run(model, prompts, norm_prologue=False)
    calls = []
    real = fused_ops.gemv
    monkeypatch.setattr(fused_ops, "gemv", lambda *a, **k: calls.append(k.get("norm_weight") is not None) or real(*a, **k))
    got = _run(model, prompts)
    assert sum(calls) >= 2 * model.cfg.num_layers * 4, "the decode steps did not take the prologue"
    assert _same(got, want, 1e-5)
    monkeypatch.setattr(fused_ops.PendingNorm, "gemv_args",
                        lambda self: dict(norm_weight=self.norm.weight, eps=self.norm.eps))   # planted: no h + delta
    assert not _same(_run(model, prompts), want, 1e-5)
