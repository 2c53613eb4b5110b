"""Block hashes: a full block is named by its tokens *and* by every token before it.

    tokens   [ 11 12 13 14 | 15 16 17 18 | 19 20 21 22 | 23 24 ]     block_size 4
                 block 0       block 1       block 2      partial: never hashed
    h0 = H(ROOT, [11 12 13 14])
    h1 = H(h0,   [15 16 17 18])
    h2 = H(h1,   [19 20 21 22])

Each hash takes its parent's, so equal ``h2`` means equal tokens 0..11, not only equal tokens
8..11. That is what makes the K/V equal: the K/V at position p depend on tokens 0..p (causal
attention, RoPE at p), so two requests whose hash chains agree up to block i have identical K/V
in blocks 0..i and may share them.

``H`` is SHA-256 over the parent hash, the block's ids as 8-byte little-endian integers, and the
``extra`` keys (vLLM puts LoRA ids, multimodal inputs and the cache salt there; this engine has
none, so they are empty unless a caller passes some). hashlib gives the same bytes in every
process; Python's ``hash()`` is salted per process and would not (vLLM hashes with SHA-256 too).
Only full blocks are hashed: a partial block is still being written to, so it has no fixed name.
"""
from __future__ import annotations

import hashlib
import struct

from plumbing.exercise import learner_can_replace

ROOT = bytes(32)   # the parent of block 0 (vLLM: NONE_HASH)


def hash_block(parent: bytes, token_ids, extra: tuple = ()) -> bytes:
    """32-byte SHA-256 of (parent, the block's token ids, extra keys)."""
    h = hashlib.sha256(parent)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if extra:
        h.update(repr(tuple(extra)).encode())
    return h.digest()


def block_hashes(token_ids, block_size: int, extra: tuple = ()) -> list[bytes]:
    """The hash chain of every *full* block of ``token_ids`` (the partial tail is left out)."""
    out, parent = [], ROOT
    for i in range(len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], extra)
        out.append(parent)
    return out


def extend_chain(chain: list[bytes], req, n_blocks: int, block_size: int) -> list[bytes]:
    """Grow ``chain``, the hash chain of ``req``'s full blocks so far, to at least ``n_blocks``
    (a request's chain is computed once and extended as its blocks fill)."""
    while len(chain) < n_blocks:
        i = len(chain)
        chain.append(hash_block(chain[-1] if chain else ROOT, req.tokens(i * block_size, block_size)))
    return chain


@learner_can_replace  # lesson 6's build-it exercise: exercises/l6_prefix_cache.py
def longest_cached_prefix(hashes: list[bytes], cached: dict, num_tokens: int, block_size: int) -> list:
    """The cached blocks of the longest prefix of ``hashes`` that is in ``cached`` (hash -> block),
    in order, leaving at least the last token to compute.

    At most ``(num_tokens - 1) // block_size`` blocks are taken, so even a prompt whose every
    block is cached computes at least one token, and that token's logits give the first sample
    (nano-vllm #144 was a zero-token prefill on a full hit). The walk stops at the first miss:
    block i is only valid after blocks 0..i-1.
    """
    out = []
    for h in hashes[:(num_tokens - 1) // block_size]:
        block = cached.get(h)
        if block is None:
            break
        out.append(block)
    return out
