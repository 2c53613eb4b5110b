"""Drafters: who guesses a request's next tokens. One small interface:

    propose(reqs, ks) -> list[list[int]]    up to ks[i] guesses for request i, after its known
                                            tokens (prompt + output); fewer, or none, is fine
    retain(ids)                             the requests still running: a drafter with per-request
                                            state (a draft model's KV blocks) frees the others

The guesses are deterministic (q = one-hot), so the acceptance rule keeps guess x with probability
p(x) (rejection.py). Each drafter here, and draft_model.py's:

    NgramDrafter    prompt lookup (vLLM's "ngram"): the longest n-gram, prompt_lookup_max down to
                    prompt_lookup_min tokens, that ends the request's tokens and occurred before;
                    propose what followed its most recent earlier occurrence. Free: host numpy.
    ReplayDrafter   for benchmarks and tests: replays a known continuation, each guess right with
                    probability ``rate`` (wrong ones are off by one token id), so a run has a chosen
                    acceptance rate even with random weights.
"""
from __future__ import annotations

import random

import numpy as np


class NgramDrafter:
    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max

    def propose(self, reqs, ks: list[int]) -> list[list[int]]:
        return [self.lookup(req.prompt_ids + req.output_ids, k) for req, k in zip(reqs, ks)]

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        a = np.asarray(tokens, dtype=np.int64)
        L = len(a)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(a[:L - 1], n)   # n-grams that end before the last token
            hits = np.flatnonzero((windows == a[L - n:]).all(axis=1))
            if len(hits):
                start = hits[-1] + n                                            # what followed the latest one
                return a[start:start + k].tolist()
        return []

    def retain(self, ids) -> None:
        pass


class ReplayDrafter:
    """``reference``: prompt ids (tuple) -> the target's own continuation (e.g. a greedy run without
    speculation). A guess at output position m is reference[m] with probability ``rate``."""

    def __init__(self, reference: dict[tuple, list[int]], rate: float, vocab_size: int, seed: int = 0):
        self.reference, self.rate, self.V = reference, rate, vocab_size
        self.rng = random.Random(seed)

    def propose(self, reqs, ks: list[int]) -> list[list[int]]:
        out = []
        for req, k in zip(reqs, ks):
            ref, m = self.reference.get(tuple(req.prompt_ids), []), len(req.output_ids)
            out.append([t if self.rng.random() < self.rate else (t + 1) % self.V for t in ref[m:m + k]])
        return out

    def retain(self, ids) -> None:
        pass
