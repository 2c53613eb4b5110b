"""The greedy generate loop, shared by every single-sequence stage.

A stage provides an *engine* with two methods, each returning the next-token logits ``[V]``:

    engine.prefill(prompt_ids: list[int])   # run the whole prompt, fill the cache
    engine.decode(token: int)               # run one new token on top of the cache

and this loop does the rest: argmax, stop on EOS, stop at ``max_new_tokens``. Stage 1's engine
keeps a dense cache; an engine that keeps K/V another way runs in the same loop, which cannot tell
them apart, and that is what makes their tokens comparable.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from plumbing.errors import UserError


class Engine:
    """Base of the single-sequence engines: a subclass implements ``step(ids) -> logits [V]``."""

    def prefill(self, prompt_ids: list[int]) -> torch.Tensor:
        return self.step(prompt_ids)

    def decode(self, token: int) -> torch.Tensor:
        return self.step([token])


@dataclass
class Generation:
    token_ids: list[int]
    finish_reason: str                                  # "stop" (EOS) | "length": vLLM's finish_reason names
    logits: list[torch.Tensor] = field(default_factory=list)  # per new token, [V] float32 on CPU


def check_prompt(prompt_ids: list[int], max_new_tokens: int, cfg, max_len: int | None = None,
                 cache_flag: str | None = None) -> None:
    """Reject bad requests before any work, with the fix in the message. ``cache_flag`` names the
    flag that sizes the KV cache (``max_len`` tokens), so the message can say to raise it."""
    if len(prompt_ids) == 0:
        raise UserError("the prompt is empty: pass --prompt TEXT or --prompt-ids 1,2,3.")
    bad = [t for t in prompt_ids if not 0 <= t < cfg.vocab_size]
    if bad:
        raise UserError(f"token ids {bad[:5]} are outside the vocabulary [0, {cfg.vocab_size}): "
                        "use ids from this model's tokenizer.")
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {max_new_tokens}.")
    need = len(prompt_ids) + max_new_tokens
    for limit, what in ((cfg.max_position_embeddings, "the model's context (max_position_embeddings)"),
                        (max_len, "the KV cache")):
        if limit is not None and need > limit:
            fix = "shorten the prompt or lower --max-new-tokens"
            if what == "the KV cache" and cache_flag:
                fix = f"raise {cache_flag}, shorten the prompt or lower --max-new-tokens"
            raise UserError(f"prompt ({len(prompt_ids)} tokens) + --max-new-tokens ({max_new_tokens}) = {need} "
                            f"exceeds {what} of {limit} tokens: {fix}.")


def greedy_generate(engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                    keep_logits: bool = False) -> Generation:
    out, kept = [], []
    logits = engine.prefill(prompt_ids)                 # [V]
    while True:
        if keep_logits:
            kept.append(logits.float().cpu())
        tok = int(logits.argmax())                      # one host sync per token: we must know if it is EOS
        out.append(tok)
        if tok in eos_ids:
            return Generation(out, "stop", kept)
        if len(out) == max_new_tokens:
            return Generation(out, "length", kept)
        logits = engine.decode(tok)
