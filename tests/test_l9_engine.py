"""Stage 9 end to end: "auto" is stage 8's engine, fp8 doubles the pool in the same memory, and the
Triton path (fused quantizing write, fp8 kernels) emits the torch reference path's tokens,
batched, chunked, preempted and prefix-hit, windows kept; the oracle check can fail."""
import pytest

from l8_sliding_window.cache import WindowedKVCache
from l9_fp8_kv import LLM, Fp8KVCache, SamplingParams
from plumbing.errors import UserError

P = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]


def run(llm, prompts, n):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=n, temperature=0,
                                                                                  ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_l9_auto_is_stage8_and_fp8_fills_the_same_memory_with_more_blocks():
    auto = LLM("tiny-qwen2-hybrid", dtype="float32", num_gpu_blocks_override=32)
    cache = auto.llm_engine.runner.cache
    assert type(cache) is WindowedKVCache                      # stage 8's part, not a converted one
    for name, per_token in (("fp8", False), ("fp8_per_token_head", True)):
        llm = LLM("tiny-qwen2-hybrid", dtype="float32", num_gpu_blocks_override=32, kv_cache_dtype=name)
        c, kv = llm.llm_engine.runner.cache, llm.llm_engine.scheduler.kv
        assert isinstance(c, Fp8KVCache) and c.per_token == per_token and str(c.K[0].dtype) == "torch.float8_e4m3fn"
        D = llm.model.cfg.head_dim
        want = auto.llm_engine.scheduler.kv.num_blocks * 4 * D // (D + (4 if per_token else 0))   # fp32 -> 1 byte
        assert kv.num_blocks == want
        assert c.nbytes <= cache.nbytes                        # the same memory (the PAD block aside)
        assert c.K[0] is c.K[1] is c.K[2]                      # stage 8's groups share the tensors
        assert (c.k_scale[0] is c.k_scale[2]) == per_token     # and the scales (per tensor: one per layer)


def test_l9_refuses_an_unknown_kv_cache_dtype_naming_the_choices():
    with pytest.raises(UserError, match="fp8_per_token_head"):
        LLM(None, kv_cache_dtype="fp8_e5m2")


def test_l9_e4m3_kernels_are_refused_below_compute_capability_8_9_in_one_line(monkeypatch):
    """Triton has no e4m3 ("fp8e4nv") before sm_89: an A100 or an RTX 30xx gets one line naming the
    fix, at construction, not a compile error at the first step (harness/gpu_compile.py --arch 80)."""
    from l9_fp8_kv.e4m3 import e4m3_refusal
    assert "8.9 or newer" in e4m3_refusal("cuda", (8, 0), False) and "is 8.6" in e4m3_refusal("cuda", (8, 6), False)
    assert e4m3_refusal("cuda", (8, 9), False) is None and e4m3_refusal("cuda", (9, 0), False) is None
    assert e4m3_refusal("cpu", None, True) is None and e4m3_refusal("cuda", (8, 0), True) is None   # the interpreter
    import l9_fp8_kv.stage as stage
    monkeypatch.setattr(stage, "e4m3_refusal", lambda *a: "the GPU is too old")          # as an A100 answers
    with pytest.raises(UserError, match=r"kv_cache_dtype='fp8': the GPU is too old\. Use kv_cache_dtype='auto'"):
        LLM(None, kv_cache_dtype="fp8")


@pytest.mark.parametrize("kv_cache_dtype,many", [("fp8", False),
                                                  pytest.param("fp8_per_token_head", True, marks=pytest.mark.deep)])
def test_l9_triton_path_emits_the_reference_paths_tokens_batched_chunked_preempted_and_shared(kv_cache_dtype, many):
    """The same quantized values through two paths: fused write + Triton kernels, and torch ops +
    quantize_kv + the attention reference. On the hybrid (windows freed) with a small pool; the
    deep case has requests enough, 12 new tokens each, to run its pool of 38 blocks
    dry (48 per tensor: 4 float32 blocks of 3 groups, 4 bytes to 1)."""
    prompts = [P * 2, P * 2 + [7, 8]] + ([P[:7], P[5:] + P, P[3:] * 2, P[9:] + P, P[1:] * 2, P + P[:20]] if many else [])
    kw = dict(dtype="float32", max_num_batched_tokens=32, num_gpu_blocks_override=4, kv_cache_dtype=kv_cache_dtype)
    ref = LLM("tiny-qwen2-hybrid", impl="torch", fused_ops=False, **kw)
    tri = LLM("tiny-qwen2-hybrid", **kw)
    assert run(tri, prompts, 12 if many else 4) == run(ref, prompts, 12 if many else 4)   # the 2nd shares the 1st's blocks
    stats = tri.llm_engine.stats
    assert not many or any(s.preempted for s in stats), "the pool was meant to be too small: no preemption happened"
    assert any(n < full for s in stats for _, _, n, full in s.chunks), "no prompt was chunked"
    kv = tri.llm_engine.scheduler.kv
    assert kv.blocks_freed > 0 and kv.stats.hits > 0 and kv.num_free == kv.num_blocks


def test_l9_accuracy_check_passes_and_fails_on_a_planted_quantizer(monkeypatch, capsys):
    """scripts/l9_accuracy.py on the reference path: OK as built; a quantizer that multiplies by the
    scale instead of dividing (codes saturate) must fail it. On the CPU in float32 wherever it runs:
    the lesson's conditions (on an H100 the bf16 default failed it; the check is what is tested)."""
    from l9_accuracy import main
    import l9_fp8_kv.cache as cache
    argv = ["--models", "tiny-qwen3", "--kv-cache-dtypes", "fp8_per_token_head", "--prompts", "4",
            "--max-new-tokens", "16", "--impl", "torch", "--device", "cpu", "--dtype", "float32"]
    assert main(argv) == 0
    assert "accuracy: OK, 1 run(s) x 64 positions" in capsys.readouterr().out
    right = cache.quantize_kv

    def planted(x, scale):
        codes, s = right(x, scale)
        return right(x.float() * s[..., None] * s[..., None], s)[0], s   # x * scale, not x / scale
    monkeypatch.setattr(cache, "quantize_kv", planted)
    assert main(argv) == 1
    assert "accuracy: FAIL" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_per_token_head"])
def test_l9_nothing_compiles_after_start_up_on_the_gpu(kv_cache_dtype, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    argv = [sys.executable, "scripts/check_no_compile.py", "--cache-dir", str(tmp_path / "triton"), "--num-gpu-blocks",
            "512", "--stage", "l9_fp8_kv", "--kv-cache-dtype", kv_cache_dtype, "--model", "tiny-qwen2-hybrid"]
    r = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(root)})
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "nothing compiled after start-up" in out, out[-3000:]
