"""Stage 7's start-up compiles every kernel variant the engine can launch (l7_fast/warmup.py).

On the CPU nothing compiles (the Triton interpreter), so the test records *which variant* each
launch would be on a GPU: the kernel, its constexprs and launch options, the dtype and 16-byte
alignment of each pointer, and for each int argument the properties Triton specialises on (== 1,
a multiple of 16, 64-bit). The pickers choose the GPU's tiles (their interpreter branch is turned
off) and pick them as for float16 (in float32 every tile is the same one, and the interpreter's
float16 dots are 20x slower), the tiny Qwen3 cut to one layer runs in float32, and a workload that makes each kind of step (a prefill alone, several at once, a
prompt chunked beside decodes, split and whole decodes, sampling) must launch nothing that start-up did not.
A planted tile choice that the start-up plan cannot see makes the same check fail.

The GPU check (``-m gpu``) runs scripts/check_no_compile.py: an empty TRITON_CACHE_DIR, and no
cache entry may appear after start-up.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

import l3_paged.attention_triton as l3_attention
from l3_paged import kernel_config
from l4_sampler.params import SamplingParams
from l7_fast import LLM
from l7_fast import attention_split, fused_act, fused_norm, fused_rope, gemv, warmup
from l7_fast.warmup import plan, warm_up

from check_no_compile import planted              # scripts/: the GPU check plants the same variant

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()
KERNELS = [l3_attention._paged_attn_kernel, attention_split._split_kv_kernel, attention_split._merge_kernel,
           fused_norm._rms_norm_kernel, fused_act._silu_mul_kernel, fused_rope._qk_norm_rope_write_kernel,
           gemv._gemv_kernel]


def variant(kernel, args, kwargs) -> tuple:
    """A launch as Triton tells variants apart."""
    fixed = set(getattr(kernel, "kwargs", {}).get("do_not_specialize") or ())
    key = [kernel.__name__]
    for name, a in zip(kernel.arg_names, args):
        if isinstance(a, torch.Tensor):
            key.append((name, str(a.dtype), a.data_ptr() % 16 == 0))
        elif isinstance(a, bool) or a is None:
            key.append((name, a))
        elif isinstance(a, int):
            key.append((name, "int") if name in fixed else (name, a == 1, a % 16 == 0, abs(a) >= 2 ** 31))
        elif isinstance(a, float):
            key.append((name, "float"))
        else:
            key.append((name, type(a).__name__))
    return tuple(key + sorted(kwargs.items()))


def _fewer_programs(k, args, grid, kwargs):
    """The GEMV's GPU tile gives a program 2-4 rows of W: N / 4 programs, each a Python call of the
    interpreter. After its variant is recorded it runs with 64 rows a program instead: each
    column's sums are the same (its K chunks do not change), and the test runs 2x faster."""
    if k is not gemv._gemv_kernel:
        return grid, kwargs
    N = args[k.arg_names.index("N")]
    return (triton.cdiv(N, 64),), {**kwargs, "BLOCK_N": 64}


def _record(mp) -> set:
    """Every launch's variant goes into the returned set (clear it between phases)."""
    seen: set = set()
    for k in KERNELS:
        run = k.run

        def recording(*args, _k=k, _run=run, grid, warmup, **kwargs):
            seen.add(variant(_k, args, kwargs))
            grid, kwargs = _fewer_programs(_k, args, grid, kwargs)
            return _run(*args, grid=grid, warmup=warmup, **kwargs)
        mp.setattr(k, "run", recording)
    return seen


def _gpu_tiles(mp) -> None:
    mp.setattr(kernel_config, "INTERPRET", False)
    mp.setattr(attention_split, "INTERPRET", False)
    mp.setattr(gemv, "INTERPRET", False)
    mp.setattr(fused_rope, "_tokens_per_program", lambda T: 1)   # the interpreter's varies with T; the GPU's is 1
    pick = kernel_config.pick_config

    def sixteen_bit_tiles(max_seqlen_q, num_tokens, num_seqs, g_pad, d_pad, dtype):
        return pick(max_seqlen_q, num_tokens, num_seqs, g_pad, d_pad, torch.float16)
    for module in (l3_attention, attention_split, warmup):      # every caller's name for it
        mp.setattr(module, "pick_config", sixteen_bit_tiles)


def one_layer_qwen3(folder: Path) -> Path:
    """tiny-qwen3 cut to its first layer: every launch of a layer is the same variant in each layer,
    so one layer shows every variant, in a quarter of the interpreter's time."""
    from safetensors.torch import load_file, save_file
    from plumbing.tiny import tiny_checkpoint
    src = tiny_checkpoint("qwen3")
    for f in src.iterdir():
        if f.suffix == ".json":
            (folder / f.name).write_text(f.read_text())
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    weights = load_file(src / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("model.layers.") or k.startswith("model.layers.0.")},
              folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """One engine with the GPU's tiles, started up (warm_up) while every launch was recorded:
    yields (llm, the variants start-up launched, the live record)."""
    if CUDA:
        pytest.skip("on a GPU the pickers already choose the GPU's tiles; -m gpu runs check_no_compile.py")
    path = one_layer_qwen3(tmp_path_factory.mktemp("one-layer-qwen3"))
    with pytest.MonkeyPatch.context() as mp:
        _gpu_tiles(mp)
        seen = _record(mp)
        llm = LLM(str(path), device="cpu", dtype="float32", max_num_batched_tokens=64, max_num_seqs=8, max_model_len=512,
                  num_gpu_blocks_override=160, enforce_eager=True, seed=0)
        seen.clear()
        warm_up(llm.llm_engine.runner)
        yield llm, frozenset(seen), seen


# (prompt lengths, new tokens) per generate call: a prefill alone and its split-KV decode, then a
# 3-prompt step and its split-KV decodes, then five short prompts decoding while a 60-token prompt
# is chunked in beside them by the 64-token budget (mixed steps), then decode in the 8-bucket;
# greedy and sampled; last, a 2-token prompt alone (the GEMV's BLOCK_M 2 beside stage 3's decode tile).
WORKLOAD = [([20], 2), ([12, 9, 5], 2), ([3, 4, 2, 5, 3, 60], 2), ([2], 1)]


def _served(started, seed, workload=WORKLOAD) -> set:
    """The variants the workload launches (its prompts drawn with ``seed``: no prefix-cache hits
    from another test's run)."""
    llm, _, seen = started
    rng = random.Random(seed)
    V = llm.model.cfg.vocab_size
    seen.clear()
    for lens, new in workload:
        prompts = [{"prompt_token_ids": [rng.randrange(V) for _ in range(n)]} for n in lens]
        params = [SamplingParams(max_tokens=new, temperature=(0.8 if i % 2 else 0), top_k=5, seed=i)
                  for i in range(len(lens))]
        llm.generate(prompts, params, use_tqdm=False)
    return set(seen)


def test_l7_start_up_launches_every_variant_the_workload_launches(started):
    served = _served(started, seed=0)
    missing = served - started[1]
    assert not missing, "launched after start-up, not by warm-up:\n" + "\n".join(map(str, sorted(missing)))
    attention = {v for v in served if v[0] in ("_paged_attn_kernel", "_split_kv_kernel")}
    assert len(attention) >= 5, f"the workload should exercise many attention variants, it ran {len(attention)}"
    assert {("SILU_MUL", True), ("SILU_MUL", False)} <= {x for v in served if v[0] == "_gemv_kernel" for x in v}


def test_l7_start_up_plan_lists_each_choice_once_with_a_shape_that_makes_it(started):
    shapes = plan(started[0].llm_engine.runner)
    assert len({s.choice for s in shapes}) == len(shapes)
    # By pick_config's rules for G_PAD 2 (8-token minimum tile), a 64-token budget, 8 sequences and
    # 512-token contexts on the CPU's 16 "SMs": decode split in 8 (buckets 1-4) or whole (8), prefill
    # tiles of 16, 32 and 64 tokens (9-16, 17-32, 33-64; up to 8 tokens is the decode tile), and
    # mixed tiles of 16 and 32 tokens. By FusedOps.gemv_tile: steps of 1 and 2 tokens take the GEMV
    # (BLOCK_M 1, 2), more take cuBLAS: buckets 1, 2 and 4 (all split in 8) are three shapes, and a
    # 2-token prefill (the decode tile, BLOCK_M 2) a fourth beside bucket 8.
    assert sorted(s.label() for s in shapes) == sorted(
        ["decode S=1 max_q=1", "decode S=2 max_q=1", "decode S=4 max_q=1", "decode S=8 max_q=1",
         "prefill S=1 max_q=2", "prefill S=1 max_q=9", "prefill S=1 max_q=17", "prefill S=1 max_q=33",
         "mixed S=8 max_q=9", "mixed S=8 max_q=17"])


def test_l7_a_planted_variant_start_up_cannot_see_is_caught(started, monkeypatch):
    """A tile choice for steps of exactly 3 sequences: the plan never probes S = 3, so start-up did
    not compile it; the workload's 3-prompt step launches it."""
    monkeypatch.setattr(l3_attention, "pick_config", planted(l3_attention.pick_config))
    missing = _served(started, seed=1, workload=WORKLOAD[1:2]) - started[1]
    assert missing and all(v[0] == "_paged_attn_kernel" and ("BLOCK_N", 32) in v for v in missing), missing


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("plant", [False, True], ids=["as shipped", "planted variant"])
def test_l7_nothing_compiles_after_start_up_on_the_gpu(plant, tmp_path):
    argv = [sys.executable, "scripts/check_no_compile.py", "--cache-dir", str(tmp_path / "triton"),
            "--num-gpu-blocks", "512"]                 # a small pool: runs beside other GPU tests (pytest -n)
    r = subprocess.run(argv + (["--plant"] if plant else []), cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = r.stdout + r.stderr
    if plant:
        assert r.returncode == 1 and "compiled after start-up" in out and "_paged_attn_kernel" in out, out[-3000:]
    else:
        assert r.returncode == 0 and "nothing compiled after start-up" in out, out[-3000:]
