"""Path A: paged attention in plain PyTorch. This is the spec the Triton kernel implements.

Inputs (all sequences of a step concatenated token-flat, S sequences):

    q            [T, H_q, D]                           new query tokens
    k_cache      [num_blocks, block_size, H_kv, D]     paged K (new tokens already written)
    v_cache      [num_blocks, block_size, H_kv, D]     paged V
    cu_seqlens_q [S+1] int32   sequence s owns q rows cu[s] .. cu[s+1]-1 (q_len = cu[s+1]-cu[s])
    seq_lens_kv  [S]   int32   total KV length of sequence s, new tokens included
    block_table  [S, max_blocks] int32   logical block j of sequence s lives in physical block
                                         block_table[s, j]; entries past the used ones are padding

Math, for query token i (0-based within sequence s) and query head h:

    kv head    g(h) = h // (H_q // H_kv)                               (grouped-query attention)
    visible    keys j = 0 .. kv_len - q_len + i                        (bottom-right causal)
    out[i, h]  = softmax_j(scale * q_i . k_j) @ v_j                    scale = 1/sqrt(D)

The causal rule is "bottom-right aligned": the last query token sees every key, the first one
sees all cached context plus itself. One rule covers prefill (q_len == kv_len), decode
(q_len == 1) and a prefill chunk on top of cached context (1 < q_len < kv_len).

Written for reading: a Python loop over sequences, a gather per sequence, and an explicit mask.
It syncs with the host (``.tolist()``) and materialises copies, so it is slow; that is fine for
a spec.
"""
from __future__ import annotations

import torch

from plumbing.exercise import learner_can_replace


@learner_can_replace  # lesson 3's build-it exercise: exercises/l3_paged.py
def visible_keys(q_len: int, kv_len: int, device) -> torch.Tensor:
    """``[q_len, kv_len]`` bool: may query i (0-based among the sequence's q_len new tokens) see key j?
    Bottom-right causal: query i sits at absolute position kv_len - q_len + i and sees keys 0..that."""
    q_pos = torch.arange(q_len, device=device) + (kv_len - q_len)  # [q_len]
    k_pos = torch.arange(kv_len, device=device)                    # [kv_len]
    return k_pos[None, :] <= q_pos[:, None]                        # [q_len, kv_len]


def paged_attention_ref(q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, block_table, *, scale=None):
    """Reference paged attention. Returns ``[T, H_q, D]`` in ``q.dtype``; computes in float32."""
    T, H_q, D = q.shape
    num_blocks, block_size, H_kv, _ = k_cache.shape
    G = H_q // H_kv                                    # query heads per kv head
    scale = D ** -0.5 if scale is None else scale
    out = torch.empty_like(q)                          # [T, H_q, D]
    cu = cu_seqlens_q.tolist()                         # host sync: fine for a reference
    kv_lens = seq_lens_kv.tolist()

    for s, kv_len in enumerate(kv_lens):
        q_start, q_end = cu[s], cu[s + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        # 1. Gather this sequence's K/V from its blocks, in logical order.
        #    read  2 * n_blocks * block_size * H_kv * D * elt bytes (whole blocks, tail included)
        #    write the same again as a dense copy, then once more in float32 (the kernel does neither)
        n_blocks = -(-kv_len // block_size)            # ceil(kv_len / block_size)
        blocks = block_table[s, :n_blocks].long()      # [n_blocks]
        k = k_cache[blocks].reshape(-1, H_kv, D)[:kv_len].float()   # [kv_len, H_kv, D]
        v = v_cache[blocks].reshape(-1, H_kv, D)[:kv_len].float()   # [kv_len, H_kv, D]

        # 2. Scores. Query head h = kv_head * G + g, so a view groups the G heads that share a
        #    kv head: no repeated K/V is materialised.
        #    read  q_len * H_q * D * elt bytes;  write H_q * q_len * kv_len * 4 bytes of scores
        qs = q[q_start:q_end].float().view(q_len, H_kv, G, D)        # [q_len, H_kv, G, D]
        scores = torch.einsum("qhgd,khd->hgqk", qs, k) * scale        # [H_kv, G, q_len, kv_len]

        # 3. Bottom-right causal mask, written out explicitly.
        #    Pitfall: F.scaled_dot_product_attention(is_causal=True) builds a TOP-LEFT aligned mask
        #    (query i sees keys 0..i). That is only right when q_len == kv_len. For a decode step
        #    (q_len=1) it would let the new token see key 0 only; for a chunk on cached context it
        #    hides most of the context. Absolute position of query i is kv_len - q_len + i.
        visible = visible_keys(q_len, kv_len, q.device)                  # [q_len, kv_len] bool
        scores = scores.masked_fill(~visible, float("-inf"))

        # 4. Softmax over keys and weighted sum of values.
        #    read/write the scores again (softmax), read kv_len * H_kv * D * 4 bytes of V copy,
        #    write q_len * H_q * D * elt bytes of output
        probs = scores.softmax(dim=-1)                                   # [H_kv, G, q_len, kv_len]
        o = torch.einsum("hgqk,khd->qhgd", probs, v)                     # [q_len, H_kv, G, D]
        out[q_start:q_end] = o.reshape(q_len, H_q, D).to(q.dtype)
    return out
