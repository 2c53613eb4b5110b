"""Programmatic dependent launch (l7_fast/pdl.py, lessons/l7_fast/9_pdl.md). On a CPU: every launcher refuses
pdl=True by name. On a Hopper GPU: one decode layer's chain (qkv GEMV -> rope + K/V write ->
split-KV -> merge -> o_proj GEMV), captured in a CUDA graph with every kernel launched with PDL,
gives bit-for-bit what the same chain gives without PDL, input after input; and so does the
tiny model through stage 7's engine. A kernel that reads before its ``gdc_wait`` (the planted bug
of the lesson's exercise) reads the previous replay's values and fails the first test."""
import importlib

import pytest
import torch

from l3_paged.paged_batch import make_paged_batch
from l7_fast.attention_split import paged_attention_split
from l7_fast.fused_rope import qk_norm_rope_write
from l7_fast.gemv import gemv
from l7_fast.pdl import pdl_supported
from plumbing.errors import UserError

HOPPER = torch.cuda.is_available() and pdl_supported(torch.device("cuda"))
requires_hopper = pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) or newer GPU (CI is CPU-only)")


def test_pdl_is_refused_by_name_where_it_cannot_run():
    if HOPPER:
        pytest.skip("this GPU runs PDL")
    x, w = torch.randn(1, 64), torch.randn(32, 64)
    with pytest.raises(UserError, match="pdl needs a Hopper"):
        gemv(x, w, pdl=True)
    q, kc, vc, cu, kv, bt = make_paged_batch([1], [40], 4, 2, 16, 16, torch.float32, "cpu")
    with pytest.raises(UserError, match="pdl needs a Hopper"):
        paged_attention_split(q, kc, vc, cu, kv, bt, max_seqlen_q=1, num_splits=2, pdl=True)
    k = torch.randn(1, 2, 16)
    with pytest.raises(UserError, match="pdl needs a Hopper"):
        qk_norm_rope_write(q, k, k.clone(), torch.ones(1, 16), torch.zeros(1, 16), kc, vc,
                           torch.zeros(1, dtype=torch.int64), pdl=True)


@pytest.mark.parametrize("stage,extra", [("l7_fast", {}), ("l8_sliding_window", {}), ("l9_fp8_kv", {}),
                                         ("l9_fp8_kv", {"kv_cache_dtype": "fp8"}), ("l11_spec_decode", {})])
def test_every_stage_hands_pdl_and_norm_prologue_to_its_ops(stage, extra, monkeypatch):
    """Later stages build stage 7's ops themselves: the options must reach them (on a CPU, with the
    GPU check pretended, since there PDL is always off)."""
    from plumbing.tiny import tiny_checkpoint
    monkeypatch.setattr("l7_fast.ops.pdl_supported", lambda device: True)
    for pdl in (False, True):
        llm = importlib.import_module(stage).LLM(str(tiny_checkpoint("qwen3")), device="cpu", pdl=pdl,
                                                 norm_prologue=not pdl, num_gpu_blocks_override=64, **extra)
        runner = llm.llm_engine.runner
        ops = getattr(runner, "runner", runner).ops
        assert (ops.pdl, ops.norm_prologue) == (pdl, not pdl), f"{stage} {extra}: pdl={pdl} did not reach its ops"


def _layer(ctx=4096, H=1024, H_q=16, H_kv=8, D=128):
    """Static buffers for one decode token of a Qwen3-0.6B-shaped layer, and the chain over them."""
    dt, dev = torch.bfloat16, "cuda"
    _, kc, vc, cu, kv, bt = make_paged_batch([1], [ctx], H_q, H_kv, D, 16, dt, dev, seed=1)
    g = torch.Generator(device=dev).manual_seed(0)
    w = dict(qkv=torch.randn(H_q * D + 2 * H_kv * D, H, device=dev, generator=g).to(dt) * 0.03,
             o=torch.randn(H, H_q * D, device=dev, generator=g).to(dt) * 0.03,
             n=torch.rand(H, device=dev, generator=g).to(dt) + 0.5,
             qn=torch.rand(D, device=dev, generator=g).to(dt) + 0.5, kn=torch.rand(D, device=dev, generator=g).to(dt) + 0.5)
    pos = ctx - 1
    slot = (bt[0, pos // 16].long() * 16 + pos % 16).view(1)
    ang = pos / 10000 ** (torch.arange(0, D, 2, device=dev) / D)
    cos, sin = torch.cat([ang.cos()] * 2).to(dt)[None], torch.cat([ang.sin()] * 2).to(dt)[None]
    x = torch.zeros(1, H, device=dev, dtype=dt)

    def chain(pdl, cache):
        qkv = gemv(x, w["qkv"], norm_weight=w["n"], pdl=pdl)
        q, k, v = qkv.split([H_q * D, H_kv * D, H_kv * D], -1)
        q = qk_norm_rope_write(q.view(1, H_q, D), k.view(1, H_kv, D), v.view(1, H_kv, D), cos, sin, *cache, slot,
                               q_norm_weight=w["qn"], k_norm_weight=w["kn"], pdl=pdl)
        o = paged_attention_split(q, *cache, cu, kv, bt, max_seqlen_q=1, num_splits=16, check=False, pdl=pdl)
        return gemv(o.view(1, H_q * D), w["o"], pdl=pdl)
    return x, (kc, vc), chain


def _graph(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()                                         # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


@pytest.mark.gpu
@requires_hopper
def test_a_layer_chained_with_pdl_in_a_cuda_graph_is_bitwise_the_chain_without():
    x, cache, chain = _layer()
    caches = {p: tuple(t.clone() for t in cache) for p in (False, True)}
    graphs = {p: _graph(lambda p=p: chain(p, caches[p])) for p in (False, True)}
    for i in range(8):                               # new input each replay: a stale read shows
        x.copy_(torch.randn(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(i)))
        for p in (False, True):
            graphs[p][0].replay()
        torch.cuda.synchronize()
        assert torch.equal(graphs[True][1], graphs[False][1]), f"input {i}: the PDL chain differs"
        for a, b in zip(caches[True], caches[False]):   # unused slots hold NaN (make_paged_batch)
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.gpu
@requires_hopper
def test_the_engine_with_pdl_decodes_what_it_decodes_without():
    from l4_sampler import SamplingParams
    from l7_fast import LLM
    from plumbing.tiny import tiny_checkpoint
    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 7 * i))} for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    got = {}
    for pdl in (False, True):
        llm = LLM(str(tiny_checkpoint("qwen3")), dtype="bfloat16", pdl=pdl, num_gpu_blocks_override=256)
        runner = llm.llm_engine.runner
        assert getattr(runner, "runner", runner).ops.pdl is pdl        # (a GraphRunner wraps the FastRunner)
        outs = llm.generate(prompts, params, use_tqdm=False)
        got[pdl] = [(o.outputs[0].token_ids, [sorted(d.items()) for d in o.outputs[0].logprobs]) for o in outs]
        del llm
        torch.cuda.empty_cache()
    assert got[True] == got[False]


@pytest.mark.gpu
@requires_hopper
def test_the_gemvs_long_rows_branch_chained_with_pdl_is_bitwise_the_plain_one():
    """K = 8,192 with the norm in the prologue: the GEMV's first pass over the input for each
    row's rstd (NORM and not ONE_CHUNK) waits before it reads; a producer GEMV writes that input."""
    dt, dev = torch.bfloat16, "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    w1 = (torch.randn(8192, 1024, device=dev, generator=g) * 0.03).to(dt)
    w2 = (torch.randn(1024, 8192, device=dev, generator=g) * 0.01).to(dt)
    nw = (torch.rand(8192, device=dev, generator=g) + 0.5).to(dt)
    x = torch.zeros(1, 1024, device=dev, dtype=dt)
    h = (torch.randn(1, 8192, device=dev, generator=g)).to(dt)

    def chain(pdl):
        d = gemv(x, w1, pdl=pdl)                                     # writes the prologue's delta
        h_out = torch.empty_like(h)
        return gemv(h, w2, norm_weight=nw, delta=d, residual_out=h_out, pdl=pdl), h_out
    graphs = {p: _graph(lambda p=p: chain(p)) for p in (False, True)}
    for i in range(8):
        x.copy_(torch.randn(x.shape, device=dev, generator=torch.Generator(dev).manual_seed(i)))
        for p in (False, True):
            graphs[p][0].replay()
        torch.cuda.synchronize()
        for a, b in zip(graphs[True][1], graphs[False][1]):
            assert torch.equal(a, b), f"input {i}: the PDL chain differs"
