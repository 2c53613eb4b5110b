"""The default mixed workload of ``scripts/l5_smoke.py`` and of the chain check's l5 row.

The usual prompt is served together with four other requests, on a small budget and a small
pool, so that prefills are chunked and the pool runs dry:

    arrival   x0 (84 tokens, 12 new) | usual (24 tokens, 20 new) | x1 (2, 6) | x2 (49, 16) | x3 (16, 10)
    engine    block_size 8, 14 blocks (112 tokens), 32 tokens per step

x0 arrives first and is the oldest; the usual prompt comes second, young enough to be preempted.
"""
from __future__ import annotations

from dataclasses import replace

#: The other requests: (text, max_tokens). Lengths differ so that they finish at different steps.
EXTRAS = [
    ("Paged attention reads keys and values straight out of the blocks: nothing is copied.", 12),
    ("Hi", 6),
    ("Continuous batching refills the batch every step.", 16),
    ("Once upon a time", 10),
]
BLOCK_SIZE, NUM_BLOCKS, BUDGET = 8, 14, 32


def extra_prompts(tokenizer, vocab_size: int, n: int = len(EXTRAS)) -> list[tuple[list[int], int]]:
    """The other requests' prompts as token ids (UTF-8 bytes when there is no tokenizer)."""
    out = []
    for text, max_tokens in EXTRAS[:n]:
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] if tokenizer is not None
               else [b % vocab_size for b in text.encode()])
        out.append((ids, max_tokens))
    return out


def add_demo_requests(engine, prompt_ids: list[int], params, extras) -> tuple[str, list[str]]:
    """Add x0, the usual prompt (id "usual"), then x1.. in that arrival order. The others keep
    ``params`` but their own max_tokens. Returns (usual id, other ids)."""
    others = [(f"x{k}", ids, replace(params, max_tokens=m, min_tokens=min(params.min_tokens, m)))
              for k, (ids, m) in enumerate(extras)]
    for rid, ids, p in others[:1] + [("usual", prompt_ids, params)] + others[1:]:
        engine.add_request({"prompt_token_ids": ids}, p, request_id=rid)
    return "usual", [rid for rid, _, _ in others]
