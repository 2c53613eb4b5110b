"""What harness/gpu_compile.py compiles: host calls that launch each kernel variant a GPU would run.

Each workload runs in a process where kernels are compiled, not interpreted, with bf16 tensors on
the CPU; the launches become compiles, so shapes may be real-sized while the tensors stay small
where only a kernel's constexprs matter. The host's own choices (tile by M, split or fold) are made
with an H100's 132 SMs, as ``pick_tile`` and ``wants_split`` would make them there."""
from __future__ import annotations

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


WORKLOADS = {"l13_matmul": l13_matmul, "l13_attention": l13_attention}
