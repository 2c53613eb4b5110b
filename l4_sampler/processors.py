"""Logit processors: a request's own rules for which tokens it may sample, applied to a float32
copy of the logits before everything else of the sampler (vLLM's order), in place on z [B, V]:

    allowed_token_ids   every token not in the list -> -inf
    bad_words           a word's token sequence may not be completed: when the output ends with
                        all of a word's tokens but its last, that last token -> -inf (a one-token
                        word is banned outright). Only the request's output counts, as in vLLM
                        (a prompt that ends with a word's first tokens bans nothing).
    logit_bias          z[token] += bias

Then stage 4's steps (sampler.py): min_tokens, penalties (which see the biased logits, as in
vLLM), greedy argmax or temperature, min_p, top-k/top-p, the race.

A word's token sequences: the tokenizer's ids for the word as given and for " " + the word,
the second kept only when it is a different word of the same length (vLLM's
``update_from_tokenizer``): ``bad_words_ids``, computed once per request by the engine. The raw
logprobs are taken before any processor (vLLM's default ``raw_logprobs``).

Cost. A batch where no row has a processor skips this file entirely; a row that has one takes
the full sampler path (``RowState.plain_greedy`` is False), so no greedy fast path (the sampler's
all-greedy branch, and any a later stage builds on it) skips its processors.
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def bad_words_ids(words: list[str], encode) -> list[list[int]]:
    """Each word's token sequences: as given (with leading spaces stripped), and with one leading
    space when that tokenizes to another word of the same length. ``encode(text) -> ids``."""
    out: list[list[int]] = []
    for word in words:
        plain = encode(word.lstrip())
        if plain:
            out.append(plain)
        spaced = encode(" " + word.lstrip())
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            out.append(spaced)
    return out


def banned_by_bad_words(words: list[list[int]], output_ids: list[int]) -> list[int]:
    """The tokens that would complete one of ``words`` after ``output_ids``."""
    banned = []
    for ids in words:
        k = len(ids) - 1
        if k <= len(output_ids) and (k == 0 or output_ids[-k:] == ids[:-1]):
            banned.append(ids[-1])
    return banned


def apply_processors(z: torch.Tensor, rows) -> torch.Tensor:
    """allowed_token_ids, bad_words, logit_bias for the rows that have them. z: [B, V] float32."""
    B, V = z.shape
    mine = [(i, r) for i, r in enumerate(rows) if r.params.has_processors]
    if not mine:
        return z
    from .sampler import to_device                          # (sampler.py imports this module)
    allowed = [(i, r.params.allowed_token_ids) for i, r in mine if r.params.allowed_token_ids]
    if allowed:                                               # only the rows that ask: [k, V] host, one copy
        keep = torch.zeros(len(allowed), V, dtype=torch.bool)
        for j, (_, ids) in enumerate(allowed):
            keep[j, ids] = True
        at = to_device([i for i, _ in allowed], torch.int64, z.device)
        z = z.index_copy(0, at, z.index_select(0, at).masked_fill(~keep.to(z.device, non_blocking=True), NEG_INF))
    flat = [i * V + t for i, r in mine if r.bad_words_ids for t in banned_by_bad_words(r.bad_words_ids, r.output_ids)]
    if flat:                                                  # flat index row * V + token, as min_tokens
        z.view(-1).index_fill_(0, to_device(flat, torch.int64, z.device), NEG_INF)
    biased = [(i * V + t, b) for i, r in mine if r.params.logit_bias for t, b in r.params.logit_bias.items()]
    if biased:
        idx = to_device([f for f, _ in biased], torch.int64, z.device)
        z.view(-1).index_add_(0, idx, to_device([b for _, b in biased], torch.float32, z.device))
    return z
