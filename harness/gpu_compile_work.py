"""What harness/gpu_compile.py compiles: host calls that launch each kernel variant a GPU would run.

Each workload runs in a process where kernels are compiled, not interpreted, with bf16 tensors on
the CPU; the launches become compiles, so shapes may be real-sized while the tensors stay small
where only a kernel's constexprs matter. The host's own choices (tile by M, split or fold) are made
with an H100's 132 SMs, as ``pick_tile`` and ``wants_split`` would make them there."""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SMS = 132                                       # an H100's SMs: the host's launch choices as on one
#: Qwen3-0.6B's and 8B's linear layers (q/k/v and gate/up merged): [N, K]
SHAPES = ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (151936, 1024), (4096, 12288))
MS = (1, 16, 64, 65, 256, 2048)                 # decode sizes, the middle, a prefill


def l13_matmul() -> None:
    """Every tile and launch (fold, split) the host picks at the 0.6B and 8B shapes, and the
    interpreter's reference tile, with and without a bias."""
    import torch

    from l13_batch_invariant.matmul import K_CHUNK, REFERENCE, matmul, pick_tile, wants_split
    bf = dict(dtype=torch.bfloat16)
    seen = set()
    for N, K in SHAPES:
        w = torch.empty(N, K, **bf)
        for M in MS:
            tile = pick_tile(M, N, SMS)
            split = wants_split(M, N, K, tile, SMS, K_CHUNK)
            for key, kw in (((tile, split, K % tile.bk == 0), dict(tile=tile, split=split)),
                            ((REFERENCE, False, True), dict(tile=REFERENCE, split=False))):
                if key not in seen:                    # one compile per kernel variant
                    seen.add(key)
                    matmul(torch.empty(M, K, **bf), w, **kw)
    matmul(torch.empty(3, 1024, **bf), torch.empty(96, 1024, **bf), torch.empty(96, **bf))    # a bias (Qwen2's qkv)
    matmul(torch.empty(3, 3072, **bf), torch.empty(1024, 3072, **bf), split=True)            # split, forced


def l13_attention() -> None:
    """The fold launch (prefill, chunk, verification) and the split launch with its merge (decode), at
    Qwen3-0.6B's heads (16 q, 8 kv, D 128) and 8B's (32 q, 8 kv)."""
    import torch

    from l13_batch_invariant.attention import paged_attention_invariant
    for h_q in (16, 32):
        k = torch.empty(64, 16, 8, 128, dtype=torch.bfloat16)              # [blocks, block_size, H_kv, D]
        table = torch.zeros(4, 64, dtype=torch.int32)
        for T, S, max_q, splits in ((1000, 1, 1000, 1), (4, 1, 4, 1), (4, 4, 1, 4), (4, 4, 1, 1)):
            q = torch.empty(T, h_q, 128, dtype=torch.bfloat16)
            cu = torch.tensor([0, T] if S == 1 else list(range(S + 1)), dtype=torch.int32)
            paged_attention_invariant(q, k, k, cu, torch.full((S,), 1000, dtype=torch.int32), table[:S],
                                      max_seqlen_q=max_q, num_splits=splits, check=False)


def l12_allreduce() -> None:
    """Stage 12's all-reduce over peer-mapped buffers, launched as PeerAllReduce launches it (its
    shipped block, warps and programs), for 2 and 4 ranks: the buffers' addresses are made up, as
    nothing runs (tests/test_l12_gpu.py runs it across GPUs); the stop flag's address an int64, as
    a pinned tensor's data_ptr() is (a small int would be typed int32, and refused as a pointer)."""
    import torch

    from l12_tensor_parallel.allreduce import BLOCK, PROGRAMS, SPIN_LIMIT, WARPS, _peer_all_reduce
    i64 = dict(dtype=torch.int64)
    for world in (2, 4):
        t = torch.empty(4096, dtype=torch.bfloat16)
        _peer_all_reduce[(PROGRAMS,)](t, torch.empty_like(t), torch.zeros(world, **i64), torch.zeros(world, **i64),
                                      torch.zeros(PROGRAMS, **i64), torch.zeros(1, dtype=torch.int32), 1 << 40, t.numel(),
                                      1 << 20, SPIN_LIMIT, PROGRAMS, RANK=1, WORLD=world, BLOCK=BLOCK, num_warps=WARPS)


#: engine options whose steps launch different kernels (the latest stage's engine, every part)
ENGINES = {"default": {}, "fp8": dict(kv_cache_dtype="fp8"), "fp8_per_token_head": dict(kv_cache_dtype="fp8_per_token_head"),
           "ngram": dict(speculative_config=dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                                                 prompt_lookup_max=3), async_scheduling=False),
           "batch_invariant": dict(batch_invariant=True)}


def engines() -> None:
    """The latest stage's engine, as a user runs it, on a random Qwen3-0.6B shape cut to two layers
    (each layer's kernels are the same): prefill, chunked prefill and decode steps of two requests
    under each of ENGINES' options; and the tiny windowed checkpoint (stage 8's kernels, its shape).
    The host code runs for real on the CPU (embedding, sampling); only the kernels are compiled,
    their outputs left unwritten, so the tokens mean nothing."""
    import torch

    from harness.random_checkpoint import build_checkpoint
    from l4_sampler.params import SamplingParams
    from l5_scheduler.stages import latest
    LLM = latest("stage").LLM
    path = build_checkpoint(os.path.join(ROOT, "out", "gpu_compile", "qwen3-0.6b-2-layers"), num_layers=2)
    prompts = [{"prompt_token_ids": list(range(1, 81))}, {"prompt_token_ids": list(range(101, 141))}]   # in every vocabulary
    for model, name, opts in [(path, n, o) for n, o in ENGINES.items()] + [("tiny-qwen2-hybrid", "default", {}),
                                                                            ("tiny-qwen2-hybrid", "fp8", ENGINES["fp8"])]:
        print(f"gpu_compile: engine {os.path.basename(model)} {name}", file=sys.stderr, flush=True)
        llm = LLM(model, device="cpu", dtype=torch.bfloat16, num_gpu_blocks_override=64, max_model_len=512,
                  max_num_batched_tokens=64, **opts)
        llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
        del llm


WORKLOADS = {"l13_matmul": l13_matmul, "l13_attention": l13_attention, "l12_allreduce": l12_allreduce,
             "engines": engines}
