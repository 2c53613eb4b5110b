"""The attention benchmarks' peers, on the K/V of a paged batch copied into SDPA's dense layout:
torch SDPA (cuDNN or FlashAttention-2 on Hopper) and compiled FlexAttention. Shape: Qwen3-8B's
attention (H_q 32, H_kv 8, D 128), bf16, 16-token blocks."""
from __future__ import annotations

import torch

F = torch.nn.functional
H_Q, H_KV, D, BLOCK_SIZE, DTYPE = 32, 8, 128, 16, torch.bfloat16
ELT = 2  # bytes per bf16 element


def dense_kv(args, ctx):
    """Gather the paged K/V of B equal-length sequences into [B, H_kv, ctx, D] for SDPA/flex."""
    _, k_cache, v_cache, _, _, table = args
    j = torch.arange(ctx, device=table.device)
    slots = table[:, j // BLOCK_SIZE].long() * BLOCK_SIZE + j % BLOCK_SIZE   # [B, ctx]
    return tuple(c.view(-1, H_KV, D)[slots].transpose(1, 2).contiguous() for c in (k_cache, v_cache))


def sdpa(q, k, v, causal):
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:  # torch without enable_gqa: materialise the repeat
        g = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                              is_causal=causal)


def make_flex(device, enabled):
    """Compiled FlexAttention, or None where it is unavailable (reported as n/a)."""
    if not enabled:
        return None
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        torch._dynamo.config.cache_size_limit = 64
        compiled = torch.compile(flex_attention, dynamic=False)

        def run(q, k, v, causal):
            mask = None
            if causal:
                T = q.shape[2]
                mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, T, T, device=device)
            return lambda: compiled(q, k, v, block_mask=mask, enable_gqa=True)
        return run
    except Exception as e:  # noqa: BLE001
        print(f"FlexAttention unavailable: {type(e).__name__}: {e}")
        return None


def try_time(bench, make_fn, rep=100):
    try:
        fn = make_fn()
        fn()
        return bench(fn, rep)
    except Exception as e:  # noqa: BLE001  (a peer failing must not stop the benchmark)
        print(f"  peer failed: {type(e).__name__}: {str(e)[:160]}")
        return None
