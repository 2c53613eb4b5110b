"""The collectives of a sharded model: where each rank's partial results are combined.

Per decoder layer there are exactly two all-reduces:

    x = norm(h)                       replicated: every rank holds all of h
    q, k, v = x @ W_qkv[r]            column-parallel: rank r's heads, no communication
    o = attention(q, k, v)            rank r's heads only (its KV heads are the ones they read)
    delta = o @ W_o[:, r]             row-parallel: a partial sum over rank r's heads
    ALL-REDUCE(delta)                 1: every rank has the whole attention output
    x = norm(h + delta)               replicated again
    a = silu(x @ W_gate[r]) * (x @ W_up[r])   column-parallel: rank r's channels, no communication
    delta = a @ W_down[:, r]          row-parallel: a partial sum over rank r's channels
    ALL-REDUCE(delta)                 2

Everything between two row-parallel matmuls is elementwise over heads or channels, so nothing else
needs another rank's numbers. The all-reduce is a forward hook on the attention and MLP modules:
it runs whichever ops (the skeleton's torch ops or the fused ones) computed the partial sum, before
the next add + RMSNorm reads it. The embedding and the lm_head split the vocabulary: a token's row
lives on one rank (the others contribute zeros to an all-reduce), and each rank's logits for its
part of the vocabulary are gathered to rank 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabParallelEmbedding(nn.Module):
    """Rows ``rank * n .. (rank + 1) * n`` of the embedding; ids outside them give zeros, then one all-reduce."""

    def __init__(self, weight: nn.Parameter, rank: int, vocab_size: int):
        super().__init__()
        self.weight, self.vocab_size = weight, vocab_size
        self.start = rank * weight.shape[0]
        self.comm = None                              # install() gives it

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside[:, None], 0)
        return self.comm.all_reduce(out)


class ParallelLMHead(nn.Module):
    """This rank's vocabulary rows; rank 0 gets every rank's logits, concatenated, cut to the vocabulary."""

    def __init__(self, weight: nn.Parameter, vocab_size: int):
        super().__init__()
        self.weight, self.vocab_size = weight, vocab_size
        self.comm = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, self.weight)              # [S, V / tp]
        gathered = self.comm.gather(logits)           # rank 0: [S, V'] ; the others: None
        return logits if gathered is None else gathered[:, :self.vocab_size]


def _all_reduce_output(comm):
    def hook(module, args, output):
        return comm.all_reduce(output)
    return hook


def install(model, comm) -> list:
    """The collectives, on a model that ``shard.build`` made a rank's shard; returns the hook handles."""
    model.model.embed_tokens.comm = model.lm_head.comm = comm
    handles = []
    for layer in model.model.layers:
        handles.append(layer.self_attn.register_forward_hook(_all_reduce_output(comm)))
        handles.append(layer.mlp.register_forward_hook(_all_reduce_output(comm)))
    return handles
