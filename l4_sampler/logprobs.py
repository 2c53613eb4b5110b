"""Logprobs of sampled tokens (stage 4's sampler) and of prompt tokens, with vLLM's meanings.

A row asking ``logprobs=k`` gets, per sampled token, its raw logprob (log_softmax of the model's
logits, before any processor or penalty), its rank among all V tokens (1 = the most likely), and
the k most likely (id, logprob) pairs; ``k = -1`` is the whole vocabulary (vLLM's meaning).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenLogprobs:
    token_id: int                  # the sampled token
    logprob: float                 # its raw logprob
    top: list[tuple[int, float]]   # the `params.logprobs` most likely (id, raw logprob), best first
    rank: int                      # the sampled token's rank among all V (1 = the most likely)


def top_and_rank(raw: torch.Tensor, ids: torch.Tensor, n: int) -> list[torch.Tensor]:
    """Per row of raw logprobs [B, V]: the n most likely (logprobs, ids), the logprob of token
    ``ids[b]`` and its rank (vLLM's, 1-based): four device tensors, no sync."""
    top_lp, top_ids = raw.topk(n, dim=-1)                 # [B, n] each
    chosen = raw.gather(1, ids[:, None])[:, 0]            # [B]
    rank = (raw > chosen[:, None]).sum(-1) + 1            # [B]
    return [top_lp, top_ids, chosen, rank]


def logprob_tensors(raw: torch.Tensor, ids: torch.Tensor, rows: list) -> list[torch.Tensor]:
    return top_and_rank(raw, ids, max(num_logprobs(r.params.logprobs, raw.shape[1]) for r in rows))


def num_logprobs(k: int | None, V: int) -> int:
    """How many top logprobs ``logprobs=k`` asks for: -1 is the whole vocabulary."""
    return 0 if k is None else V if k == -1 else min(k, V)


def token_logprobs(ids_list: list[int], rows: list, top_lp, top_ids, chosen, rank) -> list:
    out: list[TokenLogprobs | None] = []
    for i, r in enumerate(rows):
        if r.params.logprobs is None:
            out.append(None)
            continue
        m = num_logprobs(r.params.logprobs, len(top_ids[i]))
        out.append(TokenLogprobs(ids_list[i], chosen[i], list(zip(top_ids[i][:m], top_lp[i][:m])), rank[i]))
    return out


def prompt_token_logprobs(logits: torch.Tensor, targets: list[int], ks: list[int]) -> list[TokenLogprobs]:
    """prompt_logprobs: row i of ``logits`` [E, V] scores prompt token ``targets[i]`` (the token after
    its position), with the ``ks[i]`` most likely (-1: all V). Raw log_softmax, as for sampled tokens."""
    raw = logits.to(torch.float32).log_softmax(-1)                    # [E, V]
    V = raw.shape[1]
    ms = [num_logprobs(k, V) for k in ks]
    ids = torch.tensor(targets, dtype=torch.int64, device=raw.device)
    top_lp, top_ids, chosen, rank = [t.tolist() for t in top_and_rank(raw, ids, max(ms))]
    return [TokenLogprobs(t, chosen[i], list(zip(top_ids[i][:m], top_lp[i][:m])), rank[i])
            for i, (t, m) in enumerate(zip(targets, ms))]
