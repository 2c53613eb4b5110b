"""Stage 1's own layer: a dense, per-sequence KV cache.

Per layer, K and V are preallocated as ``[max_seq_len, H_kv, D]``. Prefill writes rows
``0..N-1``; each decode step appends one row. Attention runs over the valid prefix.

    prefill (T = N new tokens, nothing cached):    K[0:N]     <- k        attend q[N] over K[0:N], causal
    decode  (T = 1, L tokens cached before):        K[L]       <- k        attend q[1] over K[0:L+1]

The causal rule is ``is_causal = (T == kv_valid_len)``: when every key is also a query (prefill)
query i may only see keys 0..i; a single decode query may see all of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from plumbing.errors import UserError
from .generate import Engine

#: Default cache length when the user names none: the model's context, capped so that a real
#: model's dense cache stays a few hundred MiB (Qwen3-8B at 4096 tokens: 576 MiB).
MAX_SEQ_LEN_CAP = 4096


def default_max_seq_len(cfg) -> int:
    return min(cfg.max_position_embeddings, MAX_SEQ_LEN_CAP)


def attend_contiguous(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence's attention over a contiguous history. Shared by stages 1 and 2.

    q [T, H_q, D]; k, v [L, H_kv, D] (the whole valid history, new tokens included) -> [T, H_q, D].
    GQA is handled by SDPA's ``enable_gqa`` (query head h reads KV head h // (H_q / H_kv)).
    """
    T, L = q.shape[0], k.shape[0]
    if T != L and T != 1:
        # SDPA's is_causal aligns the mask top-left: with T < L it would hide keys the queries
        # are allowed to see. This engine never produces that case (a prefill chunk on top of
        # cached context): it prefills a prompt at once.
        raise NotImplementedError(f"{T} queries over {L} keys: chunked prefill needs stage 3")
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),      # [1, H_q, T, D]
        k.transpose(0, 1).unsqueeze(0),      # [1, H_kv, L, D]
        v.transpose(0, 1).unsqueeze(0),
        is_causal=(T == L),
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.squeeze(0).transpose(0, 1)    # [T, H_q, D]


@dataclass
class DenseMeta:
    positions: torch.Tensor       # [T] int64: RoPE positions of the new tokens
    logits_indices: torch.Tensor  # [1] int64: the row whose logits we want (the last one)
    start: int                    # tokens already in the cache (0 for prefill)


class DenseKVCache:
    def __init__(self, cfg, max_seq_len: int, device, dtype):
        shape = (max_seq_len, cfg.num_kv_heads, cfg.head_dim)
        self.K = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.V = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.max_seq_len = max_seq_len

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.K + self.V)

    def attend(self, layer: int, q, k, v, meta: DenseMeta) -> torch.Tensor:
        end = meta.start + k.shape[0]
        if end > self.max_seq_len:
            raise UserError(f"the dense cache holds {self.max_seq_len} tokens and this step needs {end}: "
                            "raise --max-seq-len or shorten the prompt / --max-new-tokens.")
        self.K[layer][meta.start:end] = k                       # write [T, H_kv, D]
        self.V[layer][meta.start:end] = v
        return attend_contiguous(q, self.K[layer][:end], self.V[layer][:end])


class DenseEngine(Engine):
    """One sequence on a dense cache: ``prefill(ids)`` then ``decode(token)``, each -> logits [V]."""

    def __init__(self, model, max_seq_len: int):
        p = next(model.parameters())
        self.model, self.device = model, p.device
        self.kv = DenseKVCache(model.cfg, max_seq_len, p.device, p.dtype)
        self.cur_len = 0

    def step(self, ids: list[int]) -> torch.Tensor:
        T = len(ids)
        meta = DenseMeta(positions=torch.arange(self.cur_len, self.cur_len + T, device=self.device),
                         logits_indices=torch.tensor([T - 1], device=self.device), start=self.cur_len)
        logits = self.model(torch.tensor(ids, device=self.device), self.kv, meta)  # [1, V]
        self.cur_len += T
        return logits[0]
