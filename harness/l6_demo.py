"""The default workload of ``scripts/l6_smoke.py`` and of the chain check's l6 row: requests
that share the usual prompt, in stage 5's small engine (so prefills are still chunked and the
pool still runs dry).

    arrival  sys   = the usual prompt + an instruction   computed first: its blocks get cached
             usual = the usual prompt                     finds sys's blocks: computes only its tail
             twin  = the usual prompt again               a full-prompt hit, capped: the last block is computed
             half  = the first half of the usual prompt   a prompt that is a prefix of another
             other = an unrelated prompt                  no hit
    engine   block_size 8, 16 blocks (128 tokens), 32 tokens per step

sys is longer than one step's budget, so its first chunks are computed (and cached) before the
usual prompt is admitted. The pool still runs dry once: a request is preempted, and when it is
readmitted it finds most of its own blocks still cached. Every request's tokens equal its tokens
without the cache.
"""
from __future__ import annotations

from dataclasses import replace

from .l5_demo import BLOCK_SIZE, BUDGET  # noqa: F401  (stage 5's block size and budget)

NUM_BLOCKS = 16   # two more than stage 5's demo: one preemption, and its readmission finds its blocks

INSTRUCTION = " Answer in one short sentence, then stop."
OTHER = "Once upon a time"
#: the other requests' max_tokens, in arrival order around the usual prompt
MAX_TOKENS = {"sys": 4, "twin": 8, "half": 6, "other": 10}


def encode(tokenizer, vocab_size: int, text: str) -> list[int]:
    """Token ids of ``text`` (UTF-8 bytes when there is no tokenizer, as stage 5's demo does)."""
    if tokenizer is not None:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return [b % vocab_size for b in text.encode()]


def shared_prompts(prompt_ids: list[int], tokenizer, vocab_size: int) -> dict[str, list[int]]:
    """The other requests' prompts, built around the usual prompt's ids."""
    return {"sys": prompt_ids + encode(tokenizer, vocab_size, INSTRUCTION),
            "twin": list(prompt_ids),
            "half": prompt_ids[:max(1, len(prompt_ids) // 2)],
            "other": encode(tokenizer, vocab_size, OTHER)}


def add_demo_requests(engine, prompt_ids: list[int], params, tokenizer=None, n: int = len(MAX_TOKENS)):
    """Add sys, the usual prompt (id "usual"), then twin, half, other (the first ``n`` of the four
    others). The others keep ``params`` but their own max_tokens. Returns (usual id, other ids)."""
    prompts = shared_prompts(prompt_ids, tokenizer, engine.model.cfg.vocab_size)
    others = list(MAX_TOKENS)[:n]
    order = others[:1] + ["usual"] + others[1:]
    for rid in order:
        if rid == "usual":
            engine.add_request({"prompt_token_ids": prompt_ids}, params, request_id="usual")
            continue
        m = MAX_TOKENS[rid]
        engine.add_request({"prompt_token_ids": prompts[rid]},
                           replace(params, max_tokens=m, min_tokens=min(params.min_tokens, m)), request_id=rid)
    return "usual", others
